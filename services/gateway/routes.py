"""HTTP routes: OpenAI chat/completions, ``/v1/models``, ``/health``, ``/live``, ``/metrics``.

Handlers are built by ``build_routes`` as closures over their collaborators, so the hot path
has no dependency injection. Each one is "decode, check, submit, respond"; the response waits
for the first upstream event before any header goes out, so an early failure gets its real
status code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any

import msgspec
import structlog
from litestar import Request, Response, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.response import Stream
from litestar.types import Receive

from services.gateway import sse
from services.gateway.bus import GatewayBus, Reply
from services.gateway.config import GatewayConfig
from services.gateway.context import current_request, note_error
from services.gateway.errors import ClientDisconnected
from services.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from services.gateway.translate import (
    chat_to_preprocess,
    completion_to_preprocess,
    parse_chat,
    parse_completion,
    routing_headers,
)
from shared.errors import InternalError, ServiceError, ShuttingDown
from shared.messages import Preprocess, ResponseChunk

log = structlog.get_logger(__name__)

JSON = "application/json"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(slots=True)
class Readiness:
    """Whether the gateway takes new work; flipped once on SIGTERM."""

    is_shutting_down: bool = False

    def begin_shutdown(self) -> None:
        if not self.is_shutting_down:
            self.is_shutting_down = True
            log.info("shutdown_started")


def build_routes(
    config: GatewayConfig,
    bus: GatewayBus,
    readiness: Readiness,
    metrics: GatewayMetrics | None = None,
) -> list[HTTPRouteHandler]:
    """The gateway's route handlers, bound to ``bus``, ``readiness`` and ``metrics``."""
    metrics = metrics or GatewayMetrics()
    relay = Relay(config, bus, readiness)

    @post("/v1/chat/completions", status_code=200, include_in_schema=False)
    async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
        ctx = current_request()
        ctx.api = "chat"
        chat = parse_chat(await request.body())
        ctx.model = chat.model
        headers = routing_headers(request.scope["headers"])
        return await relay.run(
            request, chat.model, partial(chat_to_preprocess, chat, headers=headers)
        )

    @post("/v1/completions", status_code=200, include_in_schema=False)
    async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
        ctx = current_request()
        ctx.api = "completion"
        completion = parse_completion(await request.body())
        ctx.model = completion.model
        headers = routing_headers(request.scope["headers"])
        return await relay.run(
            request,
            completion.model,
            partial(completion_to_preprocess, completion, headers=headers),
        )

    @get("/v1/models", include_in_schema=False)
    async def list_models() -> Response[bytes]:
        data = []
        for model in bus.live_models():
            card = await bus.model_card(model)
            created = card.created if card and card.created else relay.started_at
            data.append(
                {"id": model, "object": "model", "created": created, "owned_by": "jetserve"}
            )
        return Response(msgspec.json.encode({"object": "list", "data": data}), media_type=JSON)

    @get("/health", include_in_schema=False)
    async def health() -> Response[bytes]:
        models = bus.live_models()
        if readiness.is_shutting_down:
            status, reason = "shutting_down", "shutting_down"
        elif not bus.is_connected:
            status, reason = "unavailable", "nats_disconnected"
        elif not models:
            status, reason = "unavailable", "no_live_model"
        else:
            status, reason = "ok", None
        body: dict[str, Any] = {"status": status, "models": models}
        if reason is not None:
            body["reason"] = reason
        code = 200 if status == "ok" else 503
        return Response(msgspec.json.encode(body), status_code=code, media_type=JSON)

    @get("/live", include_in_schema=False)
    async def live() -> Response[bytes]:
        return Response(b'{"status":"ok"}', media_type=JSON)

    @get("/metrics", include_in_schema=False)
    async def prometheus() -> Response[bytes]:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    return [chat_completions, completions, list_models, health, live, prometheus]


class Relay:
    """Submit one validated request and turn its replies into an HTTP response.

    ``submit`` and ``collect`` are shared with the raw-ASGI fast path (``fast_path.py``).
    """

    def __init__(self, config: GatewayConfig, bus: GatewayBus, readiness: Readiness) -> None:
        self._bus = bus
        self._readiness = readiness
        self._first_timeout_s = config.request_timeout_s
        self._idle_timeout_s = config.stream_idle_timeout_s
        self.started_at = int(time.time())

    async def run(
        self,
        request: Request[Any, Any, Any],
        model: str,
        to_preprocess: Callable[..., Preprocess],
    ) -> Response[Any]:
        """Check the model, publish the request, answer with its first event (or its error)."""
        preprocess, reply = await self.submit(model, to_preprocess)
        ctx = current_request()
        async with _DisconnectWatch(request.receive, reply):
            first = await reply.next(self._first_timeout_s)
            ctx.mark_first_response()
            if not preprocess.output.stream:
                body = first.data if first.done else await self.collect(reply, first)
                reply.close()
                return Response(body, media_type=JSON)
        return Stream(
            self._stream(reply, first), media_type="text/event-stream", headers=SSE_HEADERS
        )

    @property
    def first_timeout_s(self) -> float:
        return self._first_timeout_s

    @property
    def idle_timeout_s(self) -> float:
        return self._idle_timeout_s

    async def submit(
        self, model: str, to_preprocess: Callable[..., Preprocess]
    ) -> tuple[Preprocess, Reply]:
        """Refuse while shutting down, check the model, publish; the caller owns the reply."""
        if self._readiness.is_shutting_down:
            raise ShuttingDown("The gateway is shutting down.")
        await self._bus.check_model(model)
        request_id = current_request().request_id
        now = time.time()
        preprocess = to_preprocess(
            request_id=request_id,
            reply_to=self._bus.reply_subject(request_id),
            created=int(now),
            deadline_ms=int((now + self._first_timeout_s) * 1000),
        )
        return preprocess, await self._bus.submit(preprocess)

    async def collect(self, reply: Reply, first: ResponseChunk) -> bytes:
        """A non-streamed body sent in several chunks (the formatter normally sends one)."""
        parts = [first.data]
        chunk = first
        while not chunk.done:
            chunk = await reply.next(self._idle_timeout_s)
            parts.append(chunk.data)
        return b"".join(parts)

    async def _stream(self, reply: Reply, first: ResponseChunk) -> AsyncIterator[bytes]:
        """Relay SSE bytes until ``done``; a mid-stream failure ends with an error event."""
        is_finished = False
        try:
            chunk = first
            while True:
                yield chunk.data
                if chunk.done:
                    is_finished = True
                    return
                chunk = await reply.next(self._idle_timeout_s)
        except ServiceError as exc:
            is_finished = True
            note_stream_failure(exc)
            yield sse.error_tail(exc)
        except Exception as exc:  # the response started: report in-band, log once
            is_finished = True
            log.exception("stream_crashed")
            reply.cancel("internal_error")
            yield sse.error_tail(InternalError(f"Internal error: {type(exc).__name__}"))
        finally:
            if is_finished:
                reply.close()
            else:  # closed or cancelled by Litestar: the client went away
                note_error(ClientDisconnected.code)
                reply.cancel("client_disconnected")


def note_stream_failure(exc: ServiceError) -> None:
    """Record and log a failure that ended a stream after its headers went out."""
    code = exc.code
    note_error(code)
    log.warning("stream_failed", code=code, message=exc.message)


class _DisconnectWatch:
    """Until the response starts, a client disconnect cancels the wait and the upstream work.

    Litestar notices disconnects only while it streams a body; this covers the wait for the
    first event (and the whole wait of a non-streamed response).
    """

    __slots__ = ("_is_active", "_is_disconnected", "_listener", "_receive", "_reply", "_task")

    def __init__(self, receive: Receive, reply: Reply) -> None:
        self._receive = receive
        self._reply = reply
        self._is_disconnected = False
        self._is_active = True
        self._task: asyncio.Task[Any] | None = None
        self._listener: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        self._task = asyncio.current_task()
        self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        if self._is_active and self._task is not None:
            self._is_disconnected = True
            self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._is_active = False
        if self._listener is not None:
            self._listener.cancel()
        if exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
            if self._is_disconnected and self._task is not None:
                self._task.uncancel()
                self._reply.cancel("client_disconnected")
                raise ClientDisconnected("The client closed the connection.") from None
            self._reply.cancel("cancelled")
