"""The gRPC server's HTTP/2 windows and bind address (pure parts of the wiring)."""

from __future__ import annotations

from services.gateway.config import GatewayConfig
from services.gateway.grpc.http2.connection import Http2Settings
from services.gateway.grpc.server import bind_address, http2_settings


def test_unset_windows_are_the_defaults() -> None:
    settings = http2_settings(GatewayConfig())
    assert settings == Http2Settings()
    assert (settings.stream_window, settings.connection_window) == (1 << 20, 16 << 20)


def test_each_window_setting_sets_its_own_window() -> None:
    config = GatewayConfig(
        grpc_initial_connection_window_size=32 << 20, grpc_initial_stream_window_size=65_535
    )
    settings = http2_settings(config)
    assert (settings.stream_window, settings.connection_window) == (65_535, 32 << 20)


def test_ipv6_hosts_are_bracketed() -> None:
    assert bind_address("::", 8001) == "[::]:8001"
    assert bind_address("0.0.0.0", 8001) == "0.0.0.0:8001"
