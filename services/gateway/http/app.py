"""create_app(config, bus=...) -> the gateway's ASGI app: ``Relay`` for inference, Litestar else.

``Gateway`` opens the request context (request id, access line, metrics) for every HTTP request,
hands the inference paths (``endpoints.endpoints``: chat, completions, Anthropic Messages,
Responses) to ``Relay`` (raw ASGI, ADR 010) once ``Admission`` gives them a slot
(``--max-concurrent-requests``, shared with gRPC, at most ``--max-connection-share`` of them per
client connection; else 503 before the body is read, 529 in Anthropic's dialect), and
everything else (probes, listing, ``/openapi.json``, unknown routes, lifespan) to the Litestar
app. A WebSocket on the Responses path is the Responses API's WebSocket mode
(``websocket_mode.py``); stored Responses turns (``turns``, decision 030) are read and kept by
the relay, the WebSocket mode and the routes of ``turn_routes.py``. The lifespan starts the bus,
then the gRPC server (``serve_grpc``, ADR 015) in the same event loop; it stops them in the
reverse order.

An admitted request's body must arrive within ``--body-timeout-s`` and each of its writes go out
within ``--send-timeout-s`` (``stalls.py``): past either, the connection is aborted, which ends
the request as a disconnect (``Cancel(client_disconnected)`` on the bus) with
``error=body_timeout`` / ``send_timeout`` on its access line and in ``jetserve_errors_total``,
and frees its slot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Any

import structlog
from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.enums import ScopeType
from litestar.exceptions import HTTPException
from litestar.types import ASGIApp, HTTPScope, Receive, Scope, Send

from services.gateway.config import GatewayConfig
from services.gateway.core.admission import Admission
from services.gateway.core.auth import ApiKeys
from services.gateway.core.context import RequestContext, note_error
from services.gateway.core.exchange import Exchanges, KeepAlive
from services.gateway.core.metrics import GatewayMetrics
from services.gateway.core.paths import Paths
from services.gateway.core.port import GatewayBus
from services.gateway.core.readiness import Readiness
from services.gateway.core.turn_store import MemoryTurns
from services.gateway.core.turns import Turns
from services.gateway.grpc.server import GrpcServer
from services.gateway.http import error_dialects as responses
from services.gateway.http import sse
from services.gateway.http.asgi import request_context, send_with_id
from services.gateway.http.endpoints import Endpoint, endpoints
from services.gateway.http.openapi import PATHS_KEY, openapi_config
from services.gateway.http.relay import Relay
from services.gateway.http.routes import build_ask_routes, build_routes
from services.gateway.http.stalls import BODY_TIMEOUT, SEND_TIMEOUT, BodyDeadline, BoundedSend
from services.gateway.http.turn_routes import build_turn_routes
from services.gateway.http.websocket_mode import WebSocketMode
from shared.errors import ServiceError, Unauthenticated
from shared.notify import notify_ready

log = structlog.get_logger(__name__)

JSON = "application/json"


def create_app(
    config: GatewayConfig,
    *,
    bus: GatewayBus,
    readiness: Readiness | None = None,
    metrics: GatewayMetrics | None = None,
    serve_grpc: bool = False,
    admission: Admission | None = None,
    turns: Turns | None = None,
) -> Gateway:
    """The gateway's ASGI app; ``bus`` (and the gRPC server, with ``serve_grpc``) are started
    and stopped by the app's lifespan. ``admission`` (default: ``--max-concurrent-requests``)
    counts HTTP and gRPC inference requests together. ``turns``: stored Responses turns (default:
    kept in this process, ``MemoryTurns``)."""
    turns = turns or Turns(MemoryTurns(config.responses_max_stored_bytes))
    readiness = readiness or Readiness()
    metrics = metrics or GatewayMetrics(routes=Paths.of(config).all(), prefix=config.metrics_prefix)
    metrics.base.track_in_flight(lambda: bus.in_flight)
    admission = admission or Admission(
        config.max_concurrent_requests, connection_share=config.max_connection_share
    )
    metrics.track_admission(admission)
    # One limit for both protocols.
    paths = Paths.of(config)
    keys = ApiKeys(
        config.api_keys(),
        protect_metrics=config.protect_metrics,
        protected=paths.protected,
        metrics_path=paths.metrics,
    )
    keep_alive = config.sse_keep_alive_s
    exchanges = Exchanges(
        bus,
        first_timeout_s=config.request_timeout_s,
        idle_timeout_s=config.stream_idle_timeout_s,
        keep_alive=KeepAlive(keep_alive, sse.KEEP_ALIVE) if keep_alive > 0 else None,
    )
    grpc = GrpcServer(config, bus, readiness, metrics, admission, keys) if serve_grpc else None

    @asynccontextmanager
    async def bus_lifespan(_: Litestar) -> AsyncIterator[None]:
        await bus.start()
        try:
            if grpc is not None:
                await grpc.start()
        except BaseException:
            await bus.stop()
            raise
        log.info(
            "gateway_started",
            http=f"{config.http_host}:{config.http_port}",
            grpc=grpc.address if grpc is not None else None,
            gateway_id=config.gateway_id,
            request_timeout_s=config.request_timeout_s,
        )
        notify_ready()
        try:
            yield
        finally:
            readiness.begin_shutdown()
            if grpc is not None:
                await grpc.stop(config.shutdown_grace_s)
            await bus.stop()

    app = Litestar(
        route_handlers=[
            *build_routes(bus, readiness, metrics, paths),
            *build_ask_routes(exchanges, paths, allow_unknown=config.allow_unknown_fields),
            *build_turn_routes(exchanges, turns, paths, allow_unknown=config.allow_unknown_fields),
        ],
        state=State({PATHS_KEY: paths}),
        request_max_body_size=config.max_body_bytes,
        exception_handlers={
            ServiceError: render_service_error,
            HTTPException: render_http_exception,
            Exception: render_unexpected,
        },
        lifespan=[bus_lifespan],
        openapi_config=openapi_config(),
        logging_config=None,
        debug=False,
    )
    table = endpoints(paths)
    relay = Relay(config, exchanges, table, turns)
    websocket = WebSocketMode(
        exchanges,
        turns,
        path=paths.responses,
        admission=admission,
        keys=keys,
        metrics=metrics,
        allow_unknown=config.allow_unknown_fields,
    )
    return Gateway(
        app,
        relay,
        metrics,
        grpc,
        admission,
        keys,
        config.send_timeout_s,
        config.body_timeout_s,
        paths=paths,
        table=table,
        websocket=websocket,
    )


class Gateway:
    """ASGI: a request context per HTTP request; with API keys, a 401 for a protected path
    without a valid one (``auth.ApiKeys``); inference → ``Relay``, and the inference routes
    Litestar serves (``Paths.asks``), within ``admission``; the rest → Litestar."""

    __slots__ = (
        "_admission",
        "_app",
        "_asks",
        "_body_timeout_s",
        "_endpoints",
        "_keys",
        "_metrics",
        "_probes",
        "_relay",
        "_responses_path",
        "_send_timeout_s",
        "_websocket",
        "grpc",
    )

    def __init__(
        self,
        app: ASGIApp,
        relay: Relay,
        metrics: GatewayMetrics,
        grpc: GrpcServer | None = None,
        admission: Admission | None = None,
        keys: ApiKeys | None = None,
        send_timeout_s: float = 30.0,
        body_timeout_s: float = 30.0,
        *,
        paths: Paths,
        table: dict[str, Endpoint],
        websocket: WebSocketMode | None = None,
    ) -> None:
        self._app = app
        self._websocket = websocket
        self._responses_path = paths.responses
        self._endpoints = table
        self._asks = paths.asks
        self._probes = paths.probes
        self._send_timeout_s = send_timeout_s
        self._body_timeout_s = body_timeout_s
        self._keys = keys or ApiKeys(())
        self._relay = relay
        self._metrics = metrics
        self._admission = admission or Admission()
        self.grpc = grpc
        """The gRPC server the lifespan runs (``grpc.port`` once started), if any."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP:
            with request_context(scope, self._metrics, self._probes) as ctx:
                if self._keys.protects(scope["path"]) and not self._keys.allows(scope["headers"]):
                    await self._refuse_key(ctx, send)
                elif scope["path"] in self._endpoints:
                    await self._infer(ctx, scope, receive, send)
                elif scope["path"] in self._asks and scope["method"] == "POST":
                    await self._admitted(
                        ctx,
                        scope,
                        receive,
                        send,
                        lambda rx, tx: self._app(scope, rx, send_with_id(ctx, tx)),
                    )
                else:
                    await self._app(scope, receive, send_with_id(ctx, send))
            return
        if (
            scope["type"] == ScopeType.WEBSOCKET
            and scope["path"] == self._responses_path
            and self._websocket is not None
        ):
            await self._websocket.serve(scope, receive, send)
            return
        await self._app(scope, receive, send)  # lifespan

    async def _refuse_key(self, ctx: RequestContext, send: Send) -> None:
        """401 in the API's own error shape (Anthropic's ``authentication_error`` on
        ``/v1/messages``), the body unread."""
        endpoint = self._endpoints.get(ctx.path)
        dialect = endpoint.dialect if endpoint is not None else responses.OPENAI
        error = Unauthenticated(
            "Missing or invalid API key: send it as 'Authorization: Bearer <key>' "
            "(or 'x-api-key: <key>')."
        )
        await responses.send_refusal(ctx, send, error, dialect)

    async def _infer(
        self, ctx: RequestContext, scope: HTTPScope, receive: Receive, send: Send
    ) -> None:
        """Relay an inference request within ``admission``. Only ``POST`` counts: any other
        method is a 405 from ``Relay``."""
        if scope["method"] != "POST":
            await self._relay.serve(ctx, scope, receive, send)
            return
        await self._admitted(
            ctx,
            scope,
            receive,
            send,
            lambda rx, tx: self._relay.serve(ctx, scope, rx, tx),
            self._endpoints[ctx.path].dialect,
        )

    async def _admitted(
        self,
        ctx: RequestContext,
        scope: HTTPScope,
        receive: Receive,
        send: Send,
        serve: Callable[[Receive, Send], Awaitable[None]],
        dialect: responses.ErrorDialect = responses.OPENAI,
    ) -> None:
        """Run ``serve`` with a bounded ``receive`` and ``send`` (``stalls``), holding an
        admission slot for the client's connection until the response has ended (or the client
        went, or the task was cancelled); refuse a request that gets none at once, its body
        unread, in ``dialect``."""
        admission = self._admission
        client = scope.get("client")  # (host, port): one per TCP connection
        owner: Hashable | None = None if client is None else tuple(client)
        if not admission.try_enter(owner):
            await responses.send_refusal(ctx, send, admission.refusal(owner), dialect)
            return
        body = BodyDeadline(receive, send, self._body_timeout_s)
        bounded = BoundedSend(send, self._send_timeout_s)
        try:
            await serve(body, bounded)
        finally:
            body.cancel()
            admission.leave(owner)
            if body.timed_out:
                ctx.status = 408
                note_error(BODY_TIMEOUT)
                log.warning("body_timed_out", timeout_s=self._body_timeout_s)
            elif bounded.timed_out:
                note_error(SEND_TIMEOUT)
                log.warning("send_timed_out", timeout_s=self._send_timeout_s)


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
