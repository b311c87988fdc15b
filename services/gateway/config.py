"""Gateway configuration: HTTP and gRPC listeners, per-hop timeouts, registry TTL
(``JETSERVE_GATEWAY_*``)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from services.gateway.core.auth import read_keys
from services.gateway.core.paths import Paths
from shared.config import CommonConfig, computed_setting, setting
from shared.registry import DEFAULT_WORKER_TTL_S
from shared.subjects import check_token

DEFAULT_PATHS = Paths()
PATH_SETTINGS = tuple(f"{name}_path" for name in Paths.__slots__ if name != "count_tokens")
"""The settings that name an HTTP path the gateway serves."""
WINDOW_MAX = 2**31 - 1
"""HTTP/2's largest flow-control window."""


def check_path(value: str) -> str:
    """An HTTP path setting: absolute, no query, no trailing slash."""
    if not value.startswith("/") or "?" in value or "#" in value or " " in value:
        raise ValueError(f"{value!r} is not an HTTP path (it starts with /, no query)")
    if len(value) > 1 and value.endswith("/"):
        raise ValueError(f"{value!r}: no trailing slash")
    return value


def _new_gateway_id() -> str:
    return f"gw-{secrets.token_hex(6)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayConfig(CommonConfig):
    """Everything the gateway needs; tests build it directly."""

    SERVICE = "gateway"
    DESCRIPTION = "OpenAI-compatible HTTP and KServe v2 / Triton gRPC front end."

    http_host: str = setting("127.0.0.1", "HTTP and gRPC bind host")
    http_port: int = setting(8000, "HTTP port", ge=0, le=65535)
    grpc_port: int = setting(
        8001,
        "KServe v2 / Triton gRPC port (GRPCInferenceService, health, reflection; 0 = pick a "
        "free one, logged in gateway_started)",
        ge=0,
        le=65535,
    )
    grpc_initial_connection_window_size: int = setting(
        16 * 1024 * 1024,
        "gRPC HTTP/2 connection receive window, bytes: what one client connection may have in "
        "flight to the gateway, all its streams together (so what the gateway may hold for it)",
        ge=65_535,
        le=WINDOW_MAX,
        also_env=("JETSERVE_GRPC_INITIAL_CONNECTION_WINDOW_SIZE",),
    )
    grpc_initial_stream_window_size: int = setting(
        1024 * 1024,
        "gRPC HTTP/2 per-stream receive window, bytes (SETTINGS_INITIAL_WINDOW_SIZE): what a "
        "client may send ahead on one stream. What the gateway sends is bounded by the "
        "client's windows",
        ge=1024,
        le=WINDOW_MAX,
        also_env=("JETSERVE_GRPC_INITIAL_STREAM_WINDOW_SIZE",),
    )
    grpc_max_connection_buffer_size: int = setting(
        64 * 1024 * 1024,
        "Bytes of unfinished gRPC request messages one connection may have buffered, all its "
        "streams together (at least --grpc-max-message-size); the stream that brings more fails "
        "RESOURCE_EXHAUSTED",
        ge=65_535,
    )
    grpc_idle_timeout_s: float = setting(
        300.0,
        "A gRPC connection with no call for this long (checked as often, so up to twice it) is "
        "sent GOAWAY and closed; clients reconnect",
        gt=0,
    )
    grpc_max_message_size: int = setting(
        64 * 1024 * 1024,
        "Largest gRPC message, bytes, in both directions (larger ones fail RESOURCE_EXHAUSTED)",
        ge=1024,
        le=WINDOW_MAX,
    )
    request_timeout_s: float = setting(
        60.0,
        "Longest wait for a request's first response (then 504 / DEADLINE_EXCEEDED); HTTP "
        "headers are sent only after it. A shorter gRPC client deadline wins",
        gt=0,
    )
    stream_idle_timeout_s: float = setting(
        60.0, "Longest gap between two chunks of a streamed response", gt=0
    )
    max_buffered_bytes_per_request: int = setting(
        8 * 1024 * 1024,
        "Response bytes a request may have waiting for a slow client; past it the stream ends "
        "with client_too_slow and the worker stops. 0 = no bound",
        ge=0,
    )
    retry_budget_s: float = setting(
        5.0,
        "Resubmit a request that failed with a passing 503 (a hop restarting or draining, a "
        "formatter lost) before any byte reached the client, for up to this long after its first "
        "failure; 0 = never",
        ge=0,
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
    max_concurrent_requests: int = setting(
        1024,
        "Inference requests this gateway serves at once, HTTP and gRPC together (a ModelInfer "
        "call, or one request on a ModelStreamInfer stream), each from admission until its "
        "response ends; one more is refused at once, before its body is read, with 503 / "
        "UNAVAILABLE and Retry-After (0 = no limit). The default lets a few busy workers fill "
        "their batches (vLLM's max-num-seqs is 256 to 1024) while a 10x burst is refused "
        "instead of held: each request in flight holds its body (up to 10 MB) and its "
        "buffered replies",
        ge=0,
    )
    max_connection_share: float = setting(
        0.25,
        "The share of --max-concurrent-requests one client connection (HTTP/1.1 or HTTP/2) may "
        "hold; one more from it is refused like a full gateway (503 / UNAVAILABLE). 1 = no share",
        gt=0,
        le=1,
    )
    body_timeout_s: float = setting(
        30.0,
        "An admitted HTTP request's whole body must arrive within this long (a client that "
        "trickles or withholds it would hold its slot): past it the connection is closed and the "
        "slot freed",
        gt=0,
    )
    send_timeout_s: float = setting(
        30.0,
        "A response write (HTTP or gRPC) that cannot go out within this long (the client stopped "
        "reading) ends the request: the HTTP connection is closed or the gRPC stream reset, and "
        "its admission slot is freed",
        gt=0,
    )

    drain_delay_s: float = setting(
        0.0,
        "After SIGTERM, keep listening this long while /health and /live answer 503 (so load "
        "balancers and orchestrators stop sending; what still arrives is served), then stop "
        "listening and drain within --shutdown-grace-s; 0 = stop listening at once",
        ge=0,
    )
    max_body_bytes: int = setting(
        10_000_000,
        "Largest HTTP request body, bytes, on every route (413 past it)",
        ge=1024,
    )
    sse_keep_alive_s: float = setting(
        0.0,
        "On a streamed (SSE) response with nothing to send for this long, send a comment line "
        "(': keep-alive') so proxies and clients keep the connection open; 0 = never (as "
        "Dynamo's DYN_HTTP_SSE_KEEP_ALIVE_INTERVAL_MS)",
        ge=0,
    )
    responses_store_ttl_s: float = setting(
        30 * 24 * 3600.0,
        "Stored Responses turns (store, previous_response_id, GET /v1/responses/{id}) are "
        "forgotten after this long (OpenAI keeps them 30 days); the bucket's max age",
        gt=0,
    )
    responses_store_max_bytes: int = setting(
        1024 * 1024 * 1024,
        "Bytes of stored Responses turns kept, all gateways together (a JetStream KV bucket); "
        "when full, the oldest turns are forgotten first",
        ge=1024 * 1024,
    )
    responses_max_stored_bytes: int = setting(
        1_000_000,
        "Largest stored record of one Responses turn, bytes (its input, and its response); a "
        "larger turn is answered but not stored (a marker says why), and a request whose own "
        "input is larger is refused with 400 unless store is false. At most the NATS server's "
        "max_payload less 4 KiB",
        ge=1024,
    )
    chat_path: str = setting(
        DEFAULT_PATHS.chat,
        "HTTP path of: OpenAI chat completions",
        parse=check_path,
        also_env=("DYN_HTTP_SVC_CHAT_PATH",),
    )
    completions_path: str = setting(
        DEFAULT_PATHS.completions,
        "HTTP path of: OpenAI completions",
        parse=check_path,
        also_env=("DYN_HTTP_SVC_CMP_PATH",),
    )
    embeddings_path: str = setting(
        DEFAULT_PATHS.embeddings,
        "HTTP path of: OpenAI embeddings",
        parse=check_path,
        also_env=("DYN_HTTP_SVC_EMB_PATH",),
    )
    responses_path: str = setting(
        DEFAULT_PATHS.responses,
        "HTTP path of: OpenAI Responses",
        parse=check_path,
        also_env=("DYN_HTTP_SVC_RESPONSES_PATH",),
    )
    messages_path: str = setting(
        DEFAULT_PATHS.messages,
        "HTTP path of: Anthropic Messages (count_tokens is under it)",
        parse=check_path,
        also_env=("DYN_HTTP_SVC_ANTHROPIC_PATH",),
    )
    images_path: str = setting(
        DEFAULT_PATHS.images,
        "HTTP path of: Image generation",
        parse=check_path,
    )
    videos_path: str = setting(
        DEFAULT_PATHS.videos,
        "HTTP path of: Video generation",
        parse=check_path,
    )
    models_path: str = setting(
        DEFAULT_PATHS.models,
        "HTTP path of: The model list",
        parse=check_path,
        also_env=("DYN_HTTP_SVC_MODELS_PATH",),
    )
    health_path: str = setting(
        DEFAULT_PATHS.health,
        "HTTP path of: Readiness (503 while draining or with no live model)",
        parse=check_path,
        also_env=("DYN_HTTP_SVC_HEALTH_PATH",),
    )
    live_path: str = setting(
        DEFAULT_PATHS.live,
        "HTTP path of: Liveness (503 while draining)",
        parse=check_path,
        also_env=("DYN_HTTP_SVC_LIVE_PATH",),
    )
    metrics_path: str = setting(
        DEFAULT_PATHS.metrics,
        "HTTP path of: Prometheus metrics",
        parse=check_path,
        also_env=("DYN_HTTP_SVC_METRICS_PATH",),
    )
    busy_threshold_path: str = setting(
        DEFAULT_PATHS.busy_threshold,
        "HTTP path of: Per-model busy thresholds for every router (POST sets, GET lists)",
        parse=check_path,
    )
    load_lora_adapter_path: str = setting(
        DEFAULT_PATHS.load_lora_adapter,
        "HTTP path of: Load a LoRA adapter on a model's workers (vLLM's endpoint)",
        parse=check_path,
    )
    unload_lora_adapter_path: str = setting(
        DEFAULT_PATHS.unload_lora_adapter,
        "HTTP path of: Unload a LoRA adapter from a model's workers (vLLM's endpoint)",
        parse=check_path,
    )

    allow_unknown_fields: bool = setting(
        False,
        "Ignore (and log) unknown top-level fields in OpenAI request bodies instead of refusing "
        "them with a 400 that names them",
        also_env=("JETSERVE_ALLOW_UNKNOWN_FIELDS",),
    )
    tls_cert_path: Path | None = setting(
        None,
        "Serve HTTPS with this PEM certificate (chain); needs --tls-key-path",
        also_env=("JETSERVE_TLS_CERT_PATH",),
    )
    tls_key_path: Path | None = setting(
        None,
        "The PEM private key of --tls-cert-path",
        also_env=("JETSERVE_TLS_KEY_PATH",),
    )

    api_key: str = setting(
        "",
        "API keys clients must send on /v1 and gRPC inference (Authorization: Bearer, or "
        "x-api-key), comma-separated; empty = no authentication. Prefer the env var or "
        "--api-key-file: a flag shows in the process list",
    )
    api_key_file: Path | None = setting(
        None, "A file of API keys, one per line (# comments), added to --api-key"
    )
    protect_metrics: bool = setting(
        False, "With API keys, /metrics needs one too (probes stay open)"
    )

    def __post_init__(self) -> None:
        CommonConfig.__post_init__(self)
        check_token(self.gateway_id, "--gateway-id / JETSERVE_GATEWAY_ID")
        check_tls_pair(self.tls_cert_path, self.tls_key_path)
        if self.api_key_file is not None and not self.api_key_file.is_file():
            raise ValueError(f"--api-key-file {self.api_key_file}: no such file")
        served = [check_path(getattr(self, name)) for name in PATH_SETTINGS]
        served.append(self.count_tokens_path)
        if len(set(served)) != len(served):
            raise ValueError(f"two routes on one HTTP path: {sorted(served)}")
        if self.protect_metrics and not self.api_keys():
            raise ValueError("--protect-metrics needs API keys (--api-key or --api-key-file)")

    @property
    def count_tokens_path(self) -> str:
        """Anthropic's token count, under the Messages path (as Anthropic's API has it)."""
        return f"{self.messages_path}/count_tokens"

    def api_keys(self) -> tuple[str, ...]:
        """Every configured API key (none: authentication is off)."""
        return read_keys(self.api_key, self.api_key_file)

    @property
    def tls(self) -> bool:
        """Whether the HTTP listener serves HTTPS."""
        return self.tls_cert_path is not None


def check_tls_pair(cert: Path | None, key: Path | None) -> None:
    """Both TLS paths or neither, each a readable file (``ValueError`` naming the culprit)."""
    if (cert is None) != (key is None):
        missing = "--tls-key-path" if key is None else "--tls-cert-path"
        given = "--tls-cert-path" if key is None else "--tls-key-path"
        raise ValueError(f"{given} is set but {missing} is not: TLS needs both (or neither)")
    for path, flag in ((cert, "--tls-cert-path"), (key, "--tls-key-path")):
        if path is None:
            continue
        if not path.is_file():
            raise ValueError(f"{flag} {path}: no such file")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{flag} {path}: not readable by this process")
