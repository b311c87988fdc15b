"""Router flags fall back to env vars, then defaults."""

from __future__ import annotations

import pytest

from services.router.config import RouterConfig
from shared.registry import DEFAULT_WORKER_TTL_S


def test_defaults() -> None:
    config = RouterConfig.from_cli([])
    assert (config.router_mode, config.worker_ttl_s, config.seed) == (
        "round-robin",
        DEFAULT_WORKER_TTL_S,
        None,
    )


def test_env_vars_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_ROUTER_MODE", "random")
    monkeypatch.setenv("JETSERVE_WORKER_TTL_S", "2.5")
    config = RouterConfig.from_cli(["--seed", "4"])
    assert (config.router_mode, config.worker_ttl_s, config.seed) == ("random", 2.5, 4)


def test_unknown_mode_exits_with_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        RouterConfig.from_cli(["--router-mode", "nope"])
