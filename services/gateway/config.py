"""Gateway configuration: HTTP/gRPC listeners, per-hop timeouts, registry TTL."""

from __future__ import annotations

import argparse
import secrets
from dataclasses import dataclass, field
from typing import TypeVar

from shared.config import CommonConfig, add_common_options, env, env_help
from shared.registry import DEFAULT_WORKER_TTL_S
from shared.subjects import check_token


def _new_gateway_id() -> str:
    return f"gw-{secrets.token_hex(6)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayConfig(CommonConfig):
    """Everything the gateway needs; tests build it directly."""

    http_host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    """Stored for the KServe v2 gRPC server, which is not served yet."""
    request_timeout_s: float = 60.0
    """Longest wait for the first response of a request (headers are sent only after it)."""
    stream_idle_timeout_s: float = 60.0
    """Longest gap between two chunks of a streamed response."""
    worker_ttl_s: float = DEFAULT_WORKER_TTL_S
    gateway_id: str = field(default_factory=_new_gateway_id)
    """This instance's token in reply subjects (``<ns>.v1.gateway.<gateway_id>.<request_id>``)."""
    fast_path: bool = True
    """Serve the two inference endpoints with raw ASGI in front of Litestar (ADR 010)."""

    def __post_init__(self) -> None:
        CommonConfig.__post_init__(self)
        check_token(self.gateway_id, "--gateway-id / JETSERVE_GATEWAY_ID")
        for name in ("request_timeout_s", "stream_idle_timeout_s", "worker_ttl_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0")

    @classmethod
    def from_cli(cls, argv: list[str] | None = None) -> GatewayConfig:
        """Parse flags (falling back to ``JETSERVE_GATEWAY_*`` env vars, then defaults)."""
        parser = argparse.ArgumentParser(prog="python -m services.gateway")
        add_common_options(parser, service="gateway")
        _option(parser, "--http-host", "JETSERVE_GATEWAY_HTTP_HOST", "127.0.0.1", "HTTP bind host")
        _option(parser, "--http-port", "JETSERVE_GATEWAY_HTTP_PORT", 8000, "HTTP port")
        _option(
            parser,
            "--grpc-port",
            "JETSERVE_GATEWAY_GRPC_PORT",
            8001,
            "KServe v2 gRPC port (gRPC is not served yet)",
        )
        _option(
            parser,
            "--request-timeout-s",
            "JETSERVE_GATEWAY_REQUEST_TIMEOUT_S",
            60.0,
            "Longest wait for a request's first response (then 504)",
        )
        _option(
            parser,
            "--stream-idle-timeout-s",
            "JETSERVE_GATEWAY_STREAM_IDLE_TIMEOUT_S",
            60.0,
            "Longest gap between two chunks of a stream",
        )
        _option(
            parser,
            "--worker-ttl-s",
            "JETSERVE_WORKER_TTL_S",
            DEFAULT_WORKER_TTL_S,
            "A worker whose heartbeat is older than this is not live",
        )
        _option(
            parser,
            "--gateway-id",
            "JETSERVE_GATEWAY_ID",
            "",
            "This instance's id in reply subjects (empty = random)",
        )
        parser.add_argument(
            "--fast-path",
            action=argparse.BooleanOptionalAction,
            default=env("JETSERVE_GATEWAY_FAST_PATH", True),
            help=env_help(
                "Serve /v1/chat/completions and /v1/completions with raw ASGI (else Litestar)",
                "JETSERVE_GATEWAY_FAST_PATH",
            ),
        )
        args = vars(parser.parse_args(argv))
        if not args["gateway_id"]:
            args["gateway_id"] = _new_gateway_id()
        try:
            return cls(**args)
        except ValueError as exc:
            parser.error(str(exc))


_V = TypeVar("_V", str, int, float)


def _option(parser: argparse.ArgumentParser, flag: str, var: str, default: _V, text: str) -> None:
    parser.add_argument(
        flag, type=type(default), default=env(var, default), help=env_help(text, var)
    )
