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
    monkeypatch.setenv("JETSERVE_ROUTER_WORKER_TTL_S", "2.5")
    config = RouterConfig.from_cli(["--seed", "4"])
    assert (config.router_mode, config.worker_ttl_s, config.seed) == ("random", 2.5, 4)


def test_unknown_mode_exits_with_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        RouterConfig.from_cli(["--router-mode", "nope"])


def test_kv_defaults_follow_dynamo() -> None:
    config = RouterConfig.from_cli(["--router-mode", "kv"])
    assert (config.kv_overlap_score_weight, config.router_temperature, config.kv_events) == (
        1.0,
        0.0,
        True,
    )
    assert (config.router_ttl_s, config.busy_status) == (120.0, 503)
    assert config.active_decode_blocks_threshold is None
    assert config.active_prefill_tokens_threshold is None


def test_kv_flags_and_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_ROUTER_ACTIVE_PREFILL_TOKENS_THRESHOLD", "4096")
    config = RouterConfig.from_cli(
        ["--no-kv-events", "--active-decode-blocks-threshold", "0.85", "--busy-status", "529"]
    )
    assert config.kv_events is False
    assert (config.active_decode_blocks_threshold, config.active_prefill_tokens_threshold) == (
        0.85,
        4096,
    )
    assert config.busy_status == 529


def test_decode_blocks_threshold_is_a_fraction() -> None:
    with pytest.raises(SystemExit):
        RouterConfig.from_cli(["--active-decode-blocks-threshold", "1.5"])
