"""Raw-ASGI fast path for ``POST /v1/chat/completions`` and ``POST /v1/completions``.

``FastPath`` sits in front of the Litestar app and serves exactly those two (method, path)
pairs itself; everything else (other methods, other paths, lifespan) goes to Litestar. It
skips Litestar's router, request/response objects, exception middleware and the anyio task
group of its ``Stream``, and writes the response start and the SSE chunks straight to ``send``.
What the client sees is byte-for-byte what the Litestar handlers in ``routes.py`` send (same
status codes, OpenAI error bodies, headers and SSE framing), and the request keeps the same
context, ``request_finished`` line and metrics (``context.request_context``).

One listener task per request watches ``receive`` for ``http.disconnect`` from the moment the
request is published until the response is complete; a disconnect interrupts the reply, which
publishes ``Cancel(reason="client_disconnected")``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from services.gateway import responses, sse
from services.gateway.bus import GatewayBus, Reply
from services.gateway.config import GatewayConfig
from services.gateway.context import RequestContext, id_header, note_error, request_context
from services.gateway.errors import ClientDisconnected
from services.gateway.metrics import GatewayMetrics
from services.gateway.routes import Readiness, Relay, note_stream_failure
from services.gateway.translate import (
    chat_to_preprocess,
    completion_to_preprocess,
    parse_chat,
    parse_completion,
    routing_headers,
)
from shared.errors import InternalError, ServiceError
from shared.messages import Preprocess, ResponseChunk

log = structlog.get_logger(__name__)

MAX_BODY_BYTES = 10_000_000
"""Litestar's default ``request_max_body_size``, which the Litestar routes run under."""

_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"
_JSON = (b"content-type", b"application/json")
_SSE_START = (
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
)


class _HttpError(Exception):
    """One of the errors Litestar itself raises while reading a body (413, 400, 500)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class FastPath:
    """ASGI app: the two inference endpoints served raw, everything else by ``app``."""

    __slots__ = ("_app", "_metrics", "_relay")

    def __init__(
        self,
        app: ASGIApp,
        *,
        config: GatewayConfig,
        bus: GatewayBus,
        readiness: Readiness,
        metrics: GatewayMetrics,
    ) -> None:
        self._app = app
        self._metrics = metrics
        self._relay = Relay(config, bus, readiness)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP and scope["method"] == "POST":
            path = scope["path"]
            if path in (_CHAT, _COMPLETIONS):
                with request_context(scope["headers"], path, self._metrics) as ctx:
                    await self._serve(ctx, path == _CHAT, scope, receive, send)
                return
        await self._app(scope, receive, send)

    async def _serve(
        self, ctx: RequestContext, is_chat: bool, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Decode, check, submit; then relay the replies (or answer with the error)."""
        try:
            ctx.api = "chat" if is_chat else "completion"
            body = await _read_body(scope, receive)
            to_preprocess: Callable[..., Preprocess]
            if is_chat:
                chat = parse_chat(body)
                ctx.model = model = chat.model
                headers = routing_headers(scope["headers"])
                to_preprocess = partial(chat_to_preprocess, chat, headers=headers)
            else:
                completion = parse_completion(body)
                ctx.model = model = completion.model
                headers = routing_headers(scope["headers"])
                to_preprocess = partial(completion_to_preprocess, completion, headers=headers)
            preprocess, reply = await self._relay.submit(model, to_preprocess)
        except ServiceError as exc:
            await _send_error(ctx, send, responses.service_error(exc))
            return
        except _HttpError as exc:
            parts = responses.http_error(exc.status, exc.detail, "POST", scope["path"])
            await _send_error(ctx, send, parts)
            return
        except Exception as exc:  # noqa: BLE001 - a bug: unexpected_error logs it once
            await _send_error(ctx, send, responses.unexpected_error(exc))
            return
        listener = asyncio.get_running_loop().create_task(_watch(receive, reply))
        try:
            await self._respond(ctx, reply, preprocess.output.stream, send)
        finally:
            listener.cancel()

    async def _respond(self, ctx: RequestContext, reply: Reply, stream: bool, send: Send) -> None:
        """Wait for the first event, then answer with it (JSON) or start the SSE stream."""
        relay = self._relay
        try:
            first = await reply.next(relay.first_timeout_s)
            ctx.mark_first_response()
            if not stream:
                body = first.data if first.done else await relay.collect(reply, first)
                reply.close()
        except ClientDisconnected as exc:
            reply.cancel("client_disconnected")
            await _send_error(ctx, send, responses.service_error(exc))
            return
        except ServiceError as exc:
            await _send_error(ctx, send, responses.service_error(exc))
            return
        except asyncio.CancelledError:
            reply.cancel("cancelled")
            raise
        except Exception as exc:  # noqa: BLE001 - a bug: unexpected_error logs it once
            reply.cancel("internal_error")
            await _send_error(ctx, send, responses.unexpected_error(exc))
            return
        if not stream:
            headers = [_JSON, (b"content-length", b"%d" % len(body)), id_header(ctx)]
            await _start(ctx, send, 200, headers)
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await _start(ctx, send, 200, [*_SSE_START, id_header(ctx)])
        await self._stream(reply, first, send)

    async def _stream(self, reply: Reply, first: ResponseChunk, send: Send) -> None:
        """Relay SSE bytes until ``done``; a failure ends the stream with an error event.

        Chunks that are already queued go out in one body message (one socket write); the
        bytes are the same, only their grouping into HTTP chunks differs. The last bytes go
        with ``more_body=False``, so the stream's end costs no write of its own.
        """
        idle_timeout_s = self._relay.idle_timeout_s
        is_finished = False
        parts = [first.data]
        chunk = first
        try:
            while not chunk.done:
                if not reply.ready:  # nothing more queued: flush, then wait
                    body = parts[0] if len(parts) == 1 else b"".join(parts)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                    parts.clear()
                chunk = await reply.next(idle_timeout_s)
                parts.append(chunk.data)
            is_finished = True
        except ClientDisconnected:
            pass  # is_finished stays False: cancelled below, nothing more to send
        except ServiceError as exc:
            is_finished = True
            note_stream_failure(exc)
            parts.append(sse.error_tail(exc))
        except Exception as exc:  # the response started: report in-band, log once
            is_finished = True
            log.exception("stream_crashed")
            reply.cancel("internal_error")
            parts.append(sse.error_tail(InternalError(f"Internal error: {type(exc).__name__}")))
        finally:
            if is_finished:
                reply.close()
            else:  # the client went away (or the task was cancelled)
                note_error(ClientDisconnected.code)
                reply.cancel("client_disconnected")
        if is_finished:
            body = parts[0] if len(parts) == 1 else b"".join(parts)
            await send({"type": "http.response.body", "body": body, "more_body": False})


async def _watch(receive: Receive, reply: Reply) -> None:
    """Until cancelled: on ``http.disconnect``, make the reply's next wait raise."""
    while (await receive())["type"] != "http.disconnect":
        pass
    reply.interrupt(ClientDisconnected("The client closed the connection."))


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    """The whole body, with Litestar's checks (content-length, size limit, early disconnect)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            text = value.decode("latin-1")
            try:
                announced = int(text)
            except ValueError:
                raise _HttpError(400, f"Invalid content-length: {text!r}") from None
            if announced > MAX_BODY_BYTES:
                raise _HttpError(413, "Request Entity Too Large")
            break
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise _HttpError(413, "Request Entity Too Large")
                parts.append(chunk)
            if not message.get("more_body", False):
                break
        elif message["type"] == "http.disconnect":
            raise _HttpError(500, "client disconnected prematurely")
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _start(
    ctx: RequestContext, send: Send, status: int, headers: list[tuple[bytes, bytes]]
) -> None:
    ctx.status = status
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _send_error(ctx: RequestContext, send: Send, parts: responses.ErrorParts) -> None:
    status, body, extra = parts
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in extra.items()
    ]
    headers += [_JSON, (b"content-length", b"%d" % len(body)), id_header(ctx)]
    await _start(ctx, send, status, headers)
    await send({"type": "http.response.body", "body": body, "more_body": False})
