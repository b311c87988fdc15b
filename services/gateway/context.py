"""Per-request context: the request id, and what the one ``request_finished`` log line says.

A raw ASGI middleware (cheaper than Litestar's middleware classes) mints or accepts the request
id, binds it into structlog's context vars for everything the request runs, adds the
``X-Request-Id`` response header, and logs one line (and records its metrics) when the response
is done.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from structlog.contextvars import bound_contextvars

from services.gateway.metrics import GatewayMetrics
from shared.subjects import is_token

log = structlog.get_logger(__name__)

MAX_REQUEST_ID_LEN = 64
_HEADER = b"x-request-id"


@dataclass(slots=True)
class RequestContext:
    """What the handler learns about a request, for the final log line."""

    request_id: str
    started_s: float = field(default_factory=time.perf_counter)
    status: int = 0
    api: str | None = None
    model: str | None = None
    error: str | None = None
    ttft_s: float | None = None

    def mark_first_response(self) -> None:
        self.ttft_s = time.perf_counter() - self.started_s

    @property
    def ttft_ms(self) -> float | None:
        return None if self.ttft_s is None else round(self.ttft_s * 1000, 2)


_current: ContextVar[RequestContext] = ContextVar("jetserve_gateway_request")


def current_request() -> RequestContext:
    """The context of the request being handled (set by ``RequestIdMiddleware``)."""
    return _current.get()


def note_error(code: str) -> None:
    """Record the error code for the request's log line (no-op outside a request)."""
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


class RequestIdMiddleware:
    """ASGI middleware: request id in, ``X-Request-Id`` out, one log line per request."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics | None = None) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        with request_context(scope["headers"], scope["path"], self.metrics) as ctx:
            extra_header = id_header(ctx)

            async def send_with_id(message: Message) -> None:
                if message["type"] == "http.response.start":
                    ctx.status = message["status"]
                    message["headers"] = [*message.get("headers", ()), extra_header]
                await send(message)

            await self.app(scope, receive, send_with_id)


def id_header(ctx: RequestContext) -> tuple[bytes, bytes]:
    """The ``X-Request-Id`` response header of a request."""
    return (_HEADER, ctx.request_id.encode())


@contextmanager
def request_context(
    headers: Iterable[tuple[bytes, bytes]], path: str, metrics: GatewayMetrics | None
) -> Iterator[RequestContext]:
    """The request's context for everything it runs; its log line and metrics when it ends."""
    ctx = RequestContext(request_id_from(headers))
    token = _current.set(ctx)
    try:
        with bound_contextvars(request_id=ctx.request_id):
            try:
                yield ctx
            finally:
                _finished(ctx, path, metrics)
    finally:
        _current.reset(token)


def _finished(ctx: RequestContext, path: str, metrics: GatewayMetrics | None) -> None:
    latency_s = time.perf_counter() - ctx.started_s
    if metrics is not None:
        metrics.observe(path, ctx.status, latency_s, ctx.ttft_s, ctx.error)
    latency_ms = round(latency_s * 1000, 2)
    if ctx.api is None:  # probes and listings: not worth an info line each
        log.debug("request_finished", path=path, status=ctx.status, latency_ms=latency_ms)
        return
    log.info(
        "request_finished",
        status=ctx.status,
        latency_ms=latency_ms,
        ttft_ms=ctx.ttft_ms,
        api=ctx.api,
        model=ctx.model,
        error=ctx.error,
    )
