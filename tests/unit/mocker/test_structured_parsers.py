"""The model's tool-call and reasoning syntax guessed from its name, and the settings over it."""

from __future__ import annotations

import pytest

from services.mocker.config import MockerConfig
from shared.worker.parsers import default_parsers, resolve_parsers


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Qwen/Qwen3-0.6B", ("hermes", "qwen3")),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", ("qwen3_coder", "")),
        ("Qwen/QwQ-32B", ("hermes", "qwen3")),
        ("Qwen/Qwen2.5-7B-Instruct", ("hermes", "")),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", ("", "deepseek_r1")),
        ("meta-llama/Llama-3.1-8B-Instruct", ("llama3_json", "")),
        ("meta-llama/Meta-Llama-3-8B-Instruct", ("llama3_json", "")),
        ("mistralai/Mistral-7B-Instruct-v0.3", ("mistral", "")),
        ("gpt2", ("", "")),
    ],
)
def test_default_parsers(name: str, expected: tuple[str, str]) -> None:
    assert default_parsers(name) == expected


def test_settings_override_the_guess() -> None:
    assert resolve_parsers("Qwen/Qwen3-0.6B", "auto", "auto") == ("hermes", "qwen3")
    assert resolve_parsers("Qwen/Qwen3-0.6B", "mistral", "none") == ("mistral", "")
    assert resolve_parsers("gpt2", "none", "deepseek_r1") == ("", "deepseek_r1")


def test_flags_and_env_vars() -> None:
    assert MockerConfig.from_cli([]).parsers() == ("hermes", "qwen3")
    flags = ["--tool-call-parser", "llama3_json", "--reasoning-parser", "none"]
    assert MockerConfig.from_cli(flags).parsers() == ("llama3_json", "")
    env = {"JETSERVE_MOCKER_TOOL_CALL_PARSER": "qwen3_coder"}
    assert MockerConfig.from_cli([], env).parsers() == ("qwen3_coder", "qwen3")
    with pytest.raises(SystemExit):
        MockerConfig.from_cli(["--tool-call-parser", "bogus"])
