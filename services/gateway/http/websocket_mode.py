"""The Responses API's WebSocket mode (decision 030), raw ASGI: a WebSocket on the Responses
path, each ``response.create`` event one turn, answered with the events SSE streaming gives.

Turns run one at a time, in the order they came (a second event waits for the turn before it).
Each turn is a request of its own: its request id and access line, an admission slot while it
runs (refused with an ``error`` event, status 503), the usual exchange and its limits. The
connection remembers its last turn (``Recent``), so ``previous_response_id`` continues it even
with ``store: false``; stored turns continue from any connection of any replica. A turn that
fails gets an ``error`` event and the connection stays open; a client that goes away mid-turn
cancels it upstream. API keys are checked on the upgrade (a refused one is closed with 1008,
which the server answers with HTTP 403).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Hashable

import structlog
from litestar.types import (
    Receive,
    Send,
    WebSocketAcceptEvent,
    WebSocketCloseEvent,
    WebSocketScope,
    WebSocketSendEvent,
)

from services.gateway.apis import socket_events
from services.gateway.apis.openai_responses_api import parse_responses
from services.gateway.core.admission import Admission
from services.gateway.core.auth import ApiKeys
from services.gateway.core.context import RequestContext, log_access, note_error, opened
from services.gateway.core.errors import ClientDisconnected
from services.gateway.core.exchange import Exchange, Exchanges
from services.gateway.core.metrics import GatewayMetrics
from services.gateway.core.turns import Recent, Turns
from shared.errors import InternalError, ServiceError

log = structlog.get_logger(__name__)

POLICY_VIOLATION = 1008
QUEUED_EVENTS = 4
"""Client events read ahead while a turn runs (then the socket is not read: backpressure)."""


class _Connection:
    """One accepted WebSocket: its events in arrival order, and sends that fail as a
    disconnect once the client is gone."""

    __slots__ = ("_send", "closed", "events", "exchange")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.events: asyncio.Queue[str | bytes | None] = asyncio.Queue(QUEUED_EVENTS)
        self.exchange: Exchange | None = None
        """The running turn's exchange (interrupted when the client goes)."""
        self.closed = False

    async def read(self, receive: Receive) -> None:
        """Until the client goes: queue its events; then end the running turn and the queue."""
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                break
            if message["type"] == "websocket.receive":
                await self.events.put(message.get("text") or message.get("bytes") or b"")
        self.closed = True
        if self.exchange is not None:
            self.exchange.interrupt(ClientDisconnected("The client closed the WebSocket."))
        await self.events.put(None)

    async def send(self, payload: bytes) -> None:
        if self.closed:
            raise ClientDisconnected("The client closed the WebSocket.")
        try:
            message: WebSocketSendEvent = {
                "type": "websocket.send",
                "bytes": None,
                "text": payload.decode(),
            }
            await self._send(message)
        except OSError as exc:  # uvicorn's ClientDisconnected
            self.closed = True
            raise ClientDisconnected("The client closed the WebSocket.") from exc


class WebSocketMode:
    """Serves the Responses API's WebSocket on ``path``."""

    __slots__ = ("_admission", "_allow_unknown", "_exchanges", "_keys", "_metrics", "_path",
                 "_turns")  # fmt: skip

    def __init__(
        self,
        exchanges: Exchanges,
        turns: Turns,
        *,
        path: str,
        admission: Admission,
        keys: ApiKeys,
        metrics: GatewayMetrics,
        allow_unknown: bool = False,
    ) -> None:
        self._exchanges = exchanges
        self._turns = turns
        self._path = path
        self._admission = admission
        self._keys = keys
        self._metrics = metrics
        self._allow_unknown = allow_unknown

    async def serve(self, scope: WebSocketScope, receive: Receive, send: Send) -> None:
        """Accept (with a valid key when keys are set), then run turns until the client goes."""
        if (await receive())["type"] != "websocket.connect":
            return
        if self._keys.protects(self._path) and not self._keys.allows(scope["headers"]):
            close: WebSocketCloseEvent = {
                "type": "websocket.close",
                "code": POLICY_VIOLATION,
                "reason": "Missing or invalid API key.",
            }
            await send(close)
            return
        accept: WebSocketAcceptEvent = {
            "type": "websocket.accept",
            "headers": (),
            "subprotocol": None,
        }
        await send(accept)
        conn = _Connection(send)
        reader = asyncio.get_running_loop().create_task(conn.read(receive))
        client = scope.get("client")
        owner: Hashable | None = None if client is None else tuple(client)
        recent: Recent | None = None
        try:
            while (event := await conn.events.get()) is not None:
                recent = await self._turn(conn, event, recent, owner)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _turn(
        self, conn: _Connection, event: str | bytes, recent: Recent | None, owner: Hashable | None
    ) -> Recent | None:
        """One turn, within an admission slot; the connection's last turn after it."""
        ctx = RequestContext(uuid.uuid4().hex, "WS", self._path)
        with opened(ctx, self._finished):
            if not self._admission.try_enter(owner):
                refusal = self._admission.refusal(owner)
                await self._fail(conn, ctx, refusal)
                return recent
            try:
                return await self._run(conn, ctx, event, recent)
            except ClientDisconnected:
                note_error(ClientDisconnected.code)
                return None
            except ServiceError as exc:
                await self._fail(conn, ctx, exc)
            except Exception as exc:  # a bug: logged once, the socket stays open
                log.exception("turn_crashed", error_type=type(exc).__name__)
                await self._fail(conn, ctx, InternalError("Internal server error."))
            finally:
                self._admission.leave(owner)
        return recent

    async def _run(
        self, conn: _Connection, ctx: RequestContext, event: str | bytes, recent: Recent | None
    ) -> Recent | None:
        request = parse_responses(
            socket_events.create_body(event), allow_unknown=self._allow_unknown
        )
        ctx.model = request.model
        exchanges = self._exchanges
        await exchanges.bus.check_model(request.model)
        turn = await self._turns.begin(request, recent=recent)
        bus_request, envelope = exchanges.addressed(ctx, turn.to_preprocess)
        exchange = await exchanges.submit(ctx, bus_request, envelope)
        conn.exchange = exchange
        try:
            first = await exchange.first()
            ctx.status = 200

            async def write(data: bytes) -> None:
                for payload in socket_events.server_events(data):
                    await conn.send(payload)

            try:
                done, rest = await exchange.relay(first, write)
                await self._turns.keep(turn, done.data, stream=True)
            except ServiceError as exc:
                if isinstance(exc, ClientDisconnected):
                    raise
                note_error(exc.code)
                sent = socket_events.server_events(exchange.last_data)
                number = socket_events.next_sequence(sent[-1]) if sent else None
                await write(exchange.unwritten)
                await conn.send(socket_events.error_event(exc, number))
                return None  # the connection forgets a turn that failed
            await write(rest)
        finally:
            conn.exchange = None
        return turn.kept

    async def _fail(self, conn: _Connection, ctx: RequestContext, exc: ServiceError) -> None:
        """Answer a turn that did not start with an ``error`` event."""
        note_error(exc.code)
        ctx.status = exc.status
        if exc.status >= 500:
            log.warning("turn_failed", code=exc.code, status=exc.status, message=exc.message)
        with contextlib.suppress(ClientDisconnected):
            await conn.send(socket_events.error_event(exc))

    def _finished(self, ctx: RequestContext) -> None:
        duration_s = time.perf_counter() - ctx.started_s
        self._metrics.observe(
            ctx.path, ctx.status, duration_s, ctx.ttft_s, ctx.error, ctx.completion_tokens
        )
        log_access(ctx, "WS", "path", ctx.status, duration_s)
