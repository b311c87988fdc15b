"""The gRPC server's channel args and bind address (pure parts of the wiring)."""

from __future__ import annotations

from services.gateway.config import GatewayConfig
from services.gateway.grpc_server import bind_address, server_options


def test_default_options_keep_grpc_flow_control_and_cap_messages_at_64_mib() -> None:
    options = dict(server_options(GatewayConfig()))
    assert options == {
        "grpc.so_reuseport": 0,
        "grpc.max_send_message_length": 64 * 1024 * 1024,
        "grpc.max_receive_message_length": 64 * 1024 * 1024,
    }


def test_a_stream_window_fixes_the_window_and_turns_bdp_probing_off() -> None:
    options = dict(server_options(GatewayConfig(grpc_initial_stream_window_size=1 << 20)))
    assert (options["grpc.http2.lookahead_bytes"], options["grpc.http2.bdp_probe"]) == (1 << 20, 0)


def test_the_larger_of_both_windows_is_the_fixed_window() -> None:
    config = GatewayConfig(
        grpc_initial_connection_window_size=16 << 20, grpc_initial_stream_window_size=1 << 20
    )
    assert dict(server_options(config))["grpc.http2.lookahead_bytes"] == 16 << 20


def test_max_message_size_applies_both_ways() -> None:
    options = dict(server_options(GatewayConfig(grpc_max_message_size=4096)))
    assert options["grpc.max_send_message_length"] == options["grpc.max_receive_message_length"]


def test_ipv6_hosts_are_bracketed() -> None:
    assert bind_address("::", 8001) == "[::]:8001"
    assert bind_address("0.0.0.0", 8001) == "0.0.0.0:8001"
