"""GatewayConfig: flags, env fallbacks, validation."""

from __future__ import annotations

import pytest

from services.gateway.config import GatewayConfig
from shared.registry import DEFAULT_WORKER_TTL_S


def test_defaults_bind_localhost_8000_with_a_random_gateway_id() -> None:
    config = GatewayConfig.from_cli([])
    assert (config.http_host, config.http_port, config.grpc_port) == ("127.0.0.1", 8000, 8001)
    assert (config.request_timeout_s, config.stream_idle_timeout_s) == (60.0, 60.0)
    assert config.worker_ttl_s == DEFAULT_WORKER_TTL_S
    assert config.gateway_id != GatewayConfig.from_cli([]).gateway_id


def test_env_vars_fill_in_for_missing_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_GATEWAY_HTTP_PORT", "9000")
    monkeypatch.setenv("JETSERVE_GATEWAY_WORKER_TTL_S", "3.5")
    config = GatewayConfig.from_cli([])
    assert (config.http_port, config.worker_ttl_s) == (9000, 3.5)


def test_flags_win_over_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_GATEWAY_HTTP_PORT", "9000")
    config = GatewayConfig.from_cli(["--http-port", "9100", "--gateway-id", "gw-a"])
    assert (config.http_port, config.gateway_id) == (9100, "gw-a")


def test_gateway_id_with_a_dot_is_rejected() -> None:
    with pytest.raises(SystemExit):
        GatewayConfig.from_cli(["--gateway-id", "a.b"])


def test_non_positive_timeout_is_rejected() -> None:
    with pytest.raises(ValueError, match="request-timeout-s"):
        GatewayConfig(request_timeout_s=0)


def test_grpc_windows_and_messages_default_to_16_1_and_64_mib() -> None:
    config = GatewayConfig.from_cli([])
    assert config.grpc_initial_connection_window_size == 16 * 1024 * 1024
    assert config.grpc_initial_stream_window_size == 1024 * 1024
    assert config.grpc_max_message_size == 64 * 1024 * 1024


def test_grpc_windows_also_read_the_short_env_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_GRPC_INITIAL_CONNECTION_WINDOW_SIZE", "33554432")
    monkeypatch.setenv("JETSERVE_GATEWAY_GRPC_INITIAL_STREAM_WINDOW_SIZE", "65536")
    monkeypatch.setenv("JETSERVE_GRPC_INITIAL_STREAM_WINDOW_SIZE", "5")  # the long name wins
    config = GatewayConfig.from_cli([])
    assert config.grpc_initial_connection_window_size == 32 * 1024 * 1024
    assert config.grpc_initial_stream_window_size == 65536


def test_grpc_window_beyond_http2_is_rejected() -> None:
    with pytest.raises(ValueError, match="grpc-initial-stream-window-size"):
        GatewayConfig(grpc_initial_stream_window_size=2**31)


def test_a_connection_window_below_http2s_initial_one_is_rejected() -> None:
    # A connection window only grows (WINDOW_UPDATE) from 65,535: it cannot be set lower.
    with pytest.raises(ValueError, match="grpc-initial-connection-window-size"):
        GatewayConfig(grpc_initial_connection_window_size=65_534)
