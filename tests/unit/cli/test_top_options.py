"""Where ``jetserve top`` looks: flags, ``--metrics`` URLs, and a ``jetserve up`` run dir's
``stack.json`` (written by ``Stack``, read here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli import runrecord
from services.cli.__main__ import build_parser
from services.cli.stack import Stack, StackConfig
from services.cli.top.command import TopOptions, options_from


def _options(*argv: str) -> TopOptions:
    return options_from(build_parser().parse_args(["top", *argv]))


def _record(run_dir: Path, **overrides: str) -> None:
    record = runrecord.StackRecord(
        nats_url="nats://127.0.0.1:4999",
        namespace="recorded",
        metrics={"gateway": "http://127.0.0.1:8000/metrics"},
        **overrides,
    )
    (run_dir / runrecord.RECORD_FILE).write_text(runrecord.dumps(record))


def test_a_bare_metrics_address_means_its_metrics_path() -> None:
    options = _options("--metrics", "http://h:9100", "--metrics", "http://h:1/x")
    assert options.metrics == ("http://h:9100/metrics", "http://h:1/x")


def test_the_run_dir_gives_url_namespace_and_metrics(tmp_path: Path) -> None:
    _record(tmp_path)
    options = _options("--run-dir", str(tmp_path))
    assert (options.nats_url, options.namespace) == ("nats://127.0.0.1:4999", "recorded")
    assert options.metrics == ("http://127.0.0.1:8000/metrics",)


def test_flags_win_over_the_run_dir(tmp_path: Path) -> None:
    _record(tmp_path)
    assert _options("--run-dir", str(tmp_path), "--namespace", "mine").namespace == "mine"


def test_a_secure_stacks_tap_key_is_used(tmp_path: Path) -> None:
    seed = tmp_path / "tap.nk"
    seed.write_text("SU...")
    _record(tmp_path, tap_seed=str(seed))
    options = _options("--run-dir", str(tmp_path))
    assert options.auth.nkey_seed == seed


def test_a_run_dir_without_a_record_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read .*stack\.json"):
        _options("--run-dir", str(tmp_path))


def test_the_record_lists_the_gateway_and_every_process_given_a_metrics_port(
    tmp_path: Path,
) -> None:
    stack = Stack(
        StackConfig(
            run_dir=tmp_path, routers=2, service_args={"router": ["--metrics-port", "9100"]}
        )
    )
    urls = runrecord.metrics_urls(stack.plan(), "http://127.0.0.1:8000")
    assert urls == {
        "gateway": "http://127.0.0.1:8000/metrics",
        "router-0": "http://127.0.0.1:9100/metrics",
        "router-1": "http://127.0.0.1:9101/metrics",
    }


def test_the_metrics_prefix_comes_from_the_flag_else_the_run_dir_else_the_default(
    tmp_path: Path,
) -> None:
    assert _options().metrics_prefix == "jetserve_"
    _record(tmp_path, metrics_prefix="acme_")
    assert _options("--run-dir", str(tmp_path)).metrics_prefix == "acme_"
    flagged = _options("--run-dir", str(tmp_path), "--metrics-prefix", "mine_")
    assert flagged.metrics_prefix == "mine_"


def test_a_bad_metrics_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="--metrics-prefix"):
        _options("--metrics-prefix", "9x")


def test_the_stack_records_its_metrics_prefix(tmp_path: Path) -> None:
    stack = Stack(StackConfig(run_dir=tmp_path, metrics_prefix="acme_"))
    stack._write_record(stack.plan())
    assert runrecord.read(tmp_path).metrics_prefix == "acme_"
