"""``--admission-config``: the policy file's checks and what a request gets from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.router.config import RouterConfig
from shared.admission import DEFAULT_POLICY, load_policy
from shared.errors import InvalidRequest

POLICY = """\
default_class: regular
classes:
  premium: {weight: 4}
  regular: {weight: 1}
  batch: {weight: 0.5}
tenants:
  acme: {class: premium, tokens_per_minute: 1000, classes: [batch]}
  "*": {tokens_per_minute: 50}
api_keys:
  sk-acme: acme
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "admission.yaml"
    path.write_text(text)
    return path


def test_a_request_gets_its_tenant_class_and_budget(tmp_path: Path) -> None:
    policy = load_policy(_write(tmp_path, POLICY))
    assert policy.tenant_of("sk-acme", "someone-else") == "acme"  # the key wins
    assert policy.tenant_of("sk-unknown", "t1") == "t1"
    assert policy.class_of("acme", None) == "premium"
    assert policy.class_of("acme", "batch") == "batch"  # acme may pick batch
    assert policy.class_of("t1", None) == "regular"
    assert (policy.budget("acme"), policy.budget("t1"), policy.budget(None)) == (1000, 50, None)
    assert policy.weight("premium") == 4
    with pytest.raises(InvalidRequest, match="may not be picked") as refused:
        policy.class_of("t1", "premium")
    assert refused.value.param == "x-dynamo-meta-policy-class"
    with pytest.raises(InvalidRequest, match="unknown policy class 'gold'"):
        policy.class_of("acme", "gold")


def test_no_file_is_one_default_class_without_budgets() -> None:
    assert load_policy(None) is DEFAULT_POLICY
    assert DEFAULT_POLICY.class_of("t", None) == "default"
    assert DEFAULT_POLICY.budget("t") is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("classes: {a: {weight: 0}}\ndefault_class: a\n", "classes.a.weight must be > 0"),
        ("classes: {a: {}}\n", "default_class 'default' is not in classes"),
        ("tenants: {t: {class: gold}}\n", "tenants.t: class 'gold' is not in classes"),
        ("api_keys: {k: nobody}\n", "tenant 'nobody' is not in tenants"),
        ("tenants: {t: {tokens_per_minute: 0}}\n", "tokens_per_minute must be >= 1"),
        ("clases: {}\n", "unknown field"),
    ],
)
def test_a_bad_file_is_refused_naming_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        load_policy(_write(tmp_path, text))


def test_a_service_with_a_bad_file_does_not_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _write(tmp_path, "classes: {a: {weight: -1}}\ndefault_class: a\n")
    for path in (bad, tmp_path / "missing.yaml"):
        with pytest.raises(SystemExit):
            RouterConfig.from_cli(["--admission-config", str(path)], environ={})
    errors = capsys.readouterr().err
    assert "--admission-config: " in errors
    assert "classes.a.weight must be > 0" in errors
    assert "missing.yaml" in errors
