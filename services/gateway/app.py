"""create_app(config, bus=...) -> Litestar: routes, error rendering, request ids, lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from litestar import Litestar, Request, Response
from litestar.exceptions import HTTPException
from litestar.middleware import DefineMiddleware

from services.gateway.bus import GatewayBus
from services.gateway.config import GatewayConfig
from services.gateway.context import RequestIdMiddleware, note_error
from services.gateway.errors import MethodNotAllowed, error_code
from services.gateway.metrics import GatewayMetrics
from services.gateway.routes import Readiness, build_routes
from shared.errors import InternalError, InvalidRequest, NotFound, ServiceError, http_status_of

log = structlog.get_logger(__name__)

JSON = "application/json"


def create_app(
    config: GatewayConfig,
    *,
    bus: GatewayBus,
    readiness: Readiness | None = None,
    metrics: GatewayMetrics | None = None,
) -> Litestar:
    """The gateway's ASGI app; ``bus`` is started and stopped by the app's lifespan."""
    readiness = readiness or Readiness()
    metrics = metrics or GatewayMetrics()
    metrics.base.track_in_flight(lambda: bus.in_flight)

    @asynccontextmanager
    async def bus_lifespan(_: Litestar) -> AsyncIterator[None]:
        await bus.start()
        log.info(
            "gateway_started",
            http=f"{config.http_host}:{config.http_port}",
            gateway_id=config.gateway_id,
            request_timeout_s=config.request_timeout_s,
        )
        try:
            yield
        finally:
            readiness.begin_shutdown()
            await bus.stop()

    return Litestar(
        route_handlers=build_routes(config, bus, readiness, metrics),
        middleware=[DefineMiddleware(RequestIdMiddleware, metrics=metrics)],
        exception_handlers={
            ServiceError: render_service_error,
            HTTPException: render_http_exception,
            Exception: render_unexpected,
        },
        lifespan=[bus_lifespan],
        openapi_config=None,
        logging_config=None,
        debug=False,
    )


def render_service_error(_: Request[Any, Any, Any], exc: ServiceError) -> Response[bytes]:
    """Any expected failure as its OpenAI error body, status and ``Retry-After``."""
    status = http_status_of(exc)
    code = error_code(exc)
    note_error(code)
    if status >= 500:
        log.warning("request_failed", code=code, status=status, message=exc.message)
    return Response(exc.body(), status_code=status, media_type=JSON, headers=exc.headers())


def render_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    """Litestar's own errors (unknown route, wrong method, bad input) in the OpenAI shape."""
    status = exc.status_code
    error: ServiceError
    if status == 404:
        error = NotFound(f"No route for {request.method} {request.url.path}.")
    elif status == 405:
        error = MethodNotAllowed(f"Method {request.method} is not allowed on {request.url.path}.")
    elif status < 500:
        error = InvalidRequest(str(exc.detail))
    else:
        error = InternalError(str(exc.detail))
    return Response(error.body(), status_code=status, media_type=JSON, headers=exc.headers)


def render_unexpected(_: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """A bug: one log line with the traceback, and a 500 that says nothing internal."""
    log.exception("request_crashed", error_type=type(exc).__name__)
    note_error("internal_error")
    return Response(
        InternalError("Internal server error.").body(), status_code=500, media_type=JSON
    )
