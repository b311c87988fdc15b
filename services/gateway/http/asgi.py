"""The HTTP side of the request context: open it for an ASGI request, add ``X-Request-Id`` to the
response, and write the access line (debug for ``probes``, the paths orchestrators poll)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import structlog
from litestar.types import HTTPScope, Message, Send

from services.gateway.core.context import (
    RequestContext,
    id_header,
    log_access,
    opened,
    request_id_from,
)
from services.gateway.core.metrics import GatewayMetrics

log = structlog.get_logger(__name__)


def send_with_id(ctx: RequestContext, send: Send) -> Send:
    """``send`` that records the status and appends ``X-Request-Id`` to the response start."""
    extra_header = id_header(ctx)

    async def send_and_note(message: Message) -> None:
        if message["type"] == "http.response.start":
            ctx.status = message["status"]
            message["headers"] = [*message.get("headers", ()), extra_header]
        await send(message)

    return send_and_note


@contextmanager
def request_context(
    scope: HTTPScope, metrics: GatewayMetrics, probes: frozenset[str]
) -> Iterator[RequestContext]:
    """The request's context for everything it runs; its access line and metrics when it ends."""
    ctx = RequestContext(request_id_from(scope["headers"]), scope["method"], scope["path"])
    with opened(ctx, lambda done: _finished(done, metrics, probes)):
        yield ctx


def _finished(ctx: RequestContext, metrics: GatewayMetrics, probes: frozenset[str]) -> None:
    duration_s = time.perf_counter() - ctx.started_s
    metrics.observe(ctx.path, ctx.status, duration_s, ctx.ttft_s, ctx.error, ctx.completion_tokens)
    duration_ms = round(duration_s * 1000, 2)
    if ctx.path in probes:
        log.debug("request_finished", path=ctx.path, status=ctx.status, duration_ms=duration_ms)
        return
    log_access(ctx, ctx.method, "path", ctx.status, duration_s)
