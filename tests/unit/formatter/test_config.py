"""Formatter config: defaults, flags, env fallbacks."""

from __future__ import annotations

import pytest

from services.formatter.config import FormatterConfig


def test_defaults_give_a_random_valid_formatter_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JETSERVE_FORMATTER_ID", raising=False)
    first, second = FormatterConfig.from_cli([]), FormatterConfig.from_cli([])
    assert first.formatter_id != second.formatter_id
    assert first.idle_timeout_s == 60.0


def test_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_FORMATTER_IDLE_TIMEOUT_S", "5")
    config = FormatterConfig.from_cli(["--formatter-id", "f1", "--namespace", "ns1"])
    assert (config.formatter_id, config.namespace, config.idle_timeout_s) == ("f1", "ns1", 5.0)


def test_rejects_an_id_that_is_not_a_subject_token(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        FormatterConfig.from_cli(["--formatter-id", "a.b"])
    assert "--formatter-id" in capsys.readouterr().err
    with pytest.raises(ValueError, match="formatter-id"):
        FormatterConfig(formatter_id="a.b")
