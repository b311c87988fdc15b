"""Config precedence: flag, then environment variable, then default."""

import argparse
from pathlib import Path

import pytest

from shared.config import CommonConfig, add_common_options, env


def test_env_parses_by_the_default_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_INT", "7")
    monkeypatch.setenv("X_BOOL", "yes")
    monkeypatch.setenv("X_PATH", "/tmp/a")
    assert env("X_INT", 1) == 7
    assert env("X_BOOL", False) is True
    assert env("X_PATH", Path(".")) == Path("/tmp/a")
    assert env("X_MISSING", 1.5) == 1.5


def test_flag_beats_env_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_NAMESPACE", "fromenv")
    parser = argparse.ArgumentParser()
    add_common_options(parser, service="router")
    assert parser.parse_args([]).namespace == "fromenv"
    assert parser.parse_args(["--namespace", "flag"]).namespace == "flag"


def test_bad_namespace_fails_at_startup() -> None:
    with pytest.raises(ValueError, match="JETSERVE_NAMESPACE"):
        CommonConfig(namespace="a.b")
