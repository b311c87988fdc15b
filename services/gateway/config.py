"""Gateway configuration: HTTP listener, per-hop timeouts, registry TTL (``JETSERVE_GATEWAY_*``)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from shared.config import CommonConfig, computed_setting, setting
from shared.registry import DEFAULT_WORKER_TTL_S
from shared.subjects import check_token


def _new_gateway_id() -> str:
    return f"gw-{secrets.token_hex(6)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayConfig(CommonConfig):
    """Everything the gateway needs; tests build it directly."""

    SERVICE = "gateway"
    DESCRIPTION = "OpenAI-compatible HTTP front end."

    http_host: str = setting("127.0.0.1", "HTTP bind host")
    http_port: int = setting(8000, "HTTP port", ge=0, le=65535)
    grpc_port: int = setting(
        8001, "KServe v2 gRPC port (reserved: gRPC is not served yet)", ge=0, le=65535
    )
    request_timeout_s: float = setting(
        60.0,
        "Longest wait for a request's first response (then 504); headers are sent only after it",
        gt=0,
    )
    stream_idle_timeout_s: float = setting(
        60.0, "Longest gap between two chunks of a streamed response", gt=0
    )
    worker_ttl_s: float = setting(
        DEFAULT_WORKER_TTL_S,
        "A worker whose heartbeat is older than this is not live (match the mocker's)",
        gt=0,
        aliases=("JETSERVE_WORKER_TTL_S",),
    )
    gateway_id: str = computed_setting(
        _new_gateway_id,
        "This instance's token in reply subjects, <ns>.v1.gateway.<id>.<request> (empty = random)",
        default_doc="random",
        per_instance=True,
    )

    def __post_init__(self) -> None:
        CommonConfig.__post_init__(self)
        check_token(self.gateway_id, "--gateway-id / JETSERVE_GATEWAY_ID")
