"""create_app(config, bus=...) -> Litestar: routes, error rendering, request ids, lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from litestar import Litestar, Request, Response
from litestar.exceptions import HTTPException
from litestar.middleware import DefineMiddleware
from litestar.types import ASGIApp

from services.gateway import responses
from services.gateway.bus import GatewayBus
from services.gateway.config import GatewayConfig
from services.gateway.context import RequestIdMiddleware
from services.gateway.fast_path import FastPath
from services.gateway.metrics import GatewayMetrics
from services.gateway.routes import Readiness, build_routes
from shared.errors import ServiceError

log = structlog.get_logger(__name__)

JSON = "application/json"


def create_app(
    config: GatewayConfig,
    *,
    bus: GatewayBus,
    readiness: Readiness | None = None,
    metrics: GatewayMetrics | None = None,
) -> ASGIApp:
    """The gateway's ASGI app; ``bus`` is started and stopped by the app's lifespan.

    With ``config.fast_path`` the two inference endpoints are served by ``FastPath`` (raw
    ASGI, same bytes) in front of the Litestar app, which serves everything else.
    """
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

    app = Litestar(
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
    if not config.fast_path:
        return app
    return FastPath(app, config=config, bus=bus, readiness=readiness, metrics=metrics)


def render_service_error(_: Request[Any, Any, Any], exc: ServiceError) -> Response[bytes]:
    """Any expected failure as its OpenAI error body, status and ``Retry-After``."""
    status, body, headers = responses.service_error(exc)
    return Response(body, status_code=status, media_type=JSON, headers=headers)


def render_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    """Litestar's own errors (unknown route, wrong method, bad input) in the OpenAI shape."""
    status, body, _ = responses.http_error(
        exc.status_code, str(exc.detail), request.method, request.url.path
    )
    return Response(body, status_code=status, media_type=JSON, headers=exc.headers)


def render_unexpected(_: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """A bug: one log line with the traceback, and a 500 that says nothing internal."""
    status, body, _headers = responses.unexpected_error(exc)
    return Response(body, status_code=status, media_type=JSON)
