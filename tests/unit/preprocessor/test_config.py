"""Preprocessor config: defaults, env fallback, validation."""

from __future__ import annotations

import pytest

from services.preprocessor.config import PreprocessorConfig


def test_defaults() -> None:
    config = PreprocessorConfig.from_cli([])
    assert (config.formatter_timeout_s, config.max_model_len) == (2.0, 0)


def test_flags_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_PREPROCESSOR_MAX_MODEL_LEN", "4096")
    config = PreprocessorConfig.from_cli(["--formatter-timeout-s", "0.5", "--namespace", "ns1"])
    assert (config.formatter_timeout_s, config.max_model_len, config.namespace) == (
        0.5,
        4096,
        "ns1",
    )


def test_invalid_timeout_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        PreprocessorConfig.from_cli(["--formatter-timeout-s", "0"])


def test_direct_open_is_on_by_default_and_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert PreprocessorConfig.from_cli([]).direct_open is True
    assert PreprocessorConfig.from_cli(["--no-direct-open"]).direct_open is False
    monkeypatch.setenv("JETSERVE_PREPROCESSOR_DIRECT_OPEN", "0")
    assert PreprocessorConfig.from_cli([]).direct_open is False
    assert PreprocessorConfig.from_cli(["--direct-open"]).direct_open is True
