"""Per-request context: the request id, and what the request's one access line says.

``http/asgi.py`` opens it for every HTTP request, ``grpc_context`` for every gRPC
inference request (each request on a stream is one): it mints or accepts the request id, binds
it into structlog's context vars for everything the request runs, and when the response is done
records the metrics and logs ``request_finished`` (info; debug for probes and gRPC's metadata
RPCs, ``grpc_probe_finished``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import structlog
from structlog.contextvars import bind_contextvars, reset_contextvars

from services.gateway.core.metrics import GatewayMetrics
from shared.subjects import is_token

log = structlog.get_logger(__name__)

MAX_REQUEST_ID_LEN = 64
_HEADER = b"x-request-id"


@dataclass(slots=True)
class RequestContext:
    """What the gateway learns about a request while serving it, for its access line."""

    request_id: str
    method: str
    path: str
    started_s: float = field(default_factory=time.perf_counter)
    status: int = 0
    model: str | None = None
    error: str | None = None
    ttft_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    grpc_status: str = ""
    """gRPC only: the status code's name (``OK``, ``NOT_FOUND``, …); ``path`` is the RPC."""
    bus_id: str = ""
    """The request's id on the bus: ``request_id``, with a random suffix when the client reuses
    an id the gateway saw recently (``bus_id`` of the bus)."""

    def __post_init__(self) -> None:
        if not self.bus_id:
            self.bus_id = self.request_id

    def mark_first_response(self) -> None:
        self.ttft_s = time.perf_counter() - self.started_s

    @property
    def ttft_ms(self) -> float | None:
        return None if self.ttft_s is None else round(self.ttft_s * 1000, 2)


_current: ContextVar[RequestContext] = ContextVar("jetserve_gateway_request")


def current() -> RequestContext:
    """The context of the request being served (inside ``opened``)."""
    return _current.get()


def note_error(code: str) -> None:
    """Record the error code for the request's access line (no-op outside a request)."""
    ctx = _current.get(None)
    if ctx is not None:
        ctx.error = code


def request_id_from(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The client's ``X-Request-Id`` when it is a subject token of at most 64 chars, else new."""
    for name, value in headers:
        if name == _HEADER:
            candidate = value.decode("latin-1")
            if len(candidate) <= MAX_REQUEST_ID_LEN and is_token(candidate):
                return candidate
            break
    return uuid.uuid4().hex


def id_header(ctx: RequestContext) -> tuple[bytes, bytes]:
    """The ``X-Request-Id`` response header of a request."""
    return (_HEADER, ctx.request_id.encode())


class opened:
    """``ctx`` is the current request's (``note_error``, the log's ``request_id``) while the block
    runs; ``finished(ctx)`` when it ends (metrics and the access line). A class, not a generator
    context manager: it runs once per request (about 0.6 µs less)."""

    __slots__ = ("_ctx", "_finished", "_token", "_tokens")

    def __init__(self, ctx: RequestContext, finished: Callable[[RequestContext], None]) -> None:
        self._ctx = ctx
        self._finished = finished

    def __enter__(self) -> None:
        self._token = _current.set(self._ctx)
        self._tokens = bind_contextvars(request_id=self._ctx.request_id)

    def __exit__(self, *exc: object) -> None:
        try:
            self._finished(self._ctx)
        finally:
            reset_contextvars(**self._tokens)
            _current.reset(self._token)


@contextmanager
def grpc_context(
    rpc: str, metrics: GatewayMetrics, request_id: str | None = None
) -> Iterator[RequestContext]:
    """A gRPC request's context (``method="grpc"``, ``path`` = the RPC, status ``OK`` until
    set); its access line and metrics when it ends. A cancelled request is ``CANCELLED``."""
    ctx = RequestContext(request_id or uuid.uuid4().hex, "grpc", rpc, grpc_status="OK")
    with opened(ctx, lambda done: _grpc_finished(done, metrics)):
        try:
            yield ctx
        except asyncio.CancelledError:
            ctx.grpc_status = "CANCELLED"
            raise


def grpc_probe_finished(rpc: str, status: str, started_s: float, metrics: GatewayMetrics) -> None:
    """Metrics and a debug access line for a metadata RPC (liveness, readiness, metadata)."""
    duration_s = time.perf_counter() - started_s
    metrics.observe_grpc(rpc, status, duration_s)
    log.debug("request_finished", method="grpc", rpc=rpc, status=status)


def _grpc_finished(ctx: RequestContext, metrics: GatewayMetrics) -> None:
    duration_s = time.perf_counter() - ctx.started_s
    metrics.observe_grpc(
        ctx.path, ctx.grpc_status, duration_s, ctx.ttft_s, ctx.error, ctx.completion_tokens
    )
    log_access(ctx, "grpc", "rpc", ctx.grpc_status, duration_s)


def log_access(
    ctx: RequestContext, method: str, route_key: str, status: int | str, duration_s: float
) -> None:
    """The one INFO access line of a request (HTTP: ``path`` and a status code; gRPC: ``rpc``
    and a status name)."""
    fields: dict[str, object] = {
        "method": method,
        route_key: ctx.path,
        "model": ctx.model,
        "status": status,
        "ttft_ms": ctx.ttft_ms,
        "duration_ms": round(duration_s * 1000, 2),
        "prompt_tokens": ctx.prompt_tokens,
        "completion_tokens": ctx.completion_tokens,
        "request_id": ctx.request_id,
    }
    if ctx.error is not None:
        fields["error"] = ctx.error
    log.info("request_finished", **fields)
