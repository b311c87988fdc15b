"""The inference request lifecycle, raw ASGI, for every path in ``endpoints.ENDPOINTS``: OpenAI
chat and completions, Anthropic Messages (and ``count_tokens``), the Responses API.

Read the body (with Litestar's checks), parse, submit, wait for the first event, then answer
with a JSON body or an SSE stream; an error before the first event gets its real status, one
after the headers ends the stream in-band, each in the endpoint's error dialect. A timeout or a
client disconnect cancels upstream. ``count_tokens`` asks the preprocessors instead (request/
reply) and answers ``{"input_tokens": N}``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import msgspec
import structlog
from litestar.types import HTTPScope, Receive, Send

from services.gateway.apis.nvext import routing_headers
from services.gateway.core.bus import GatewayBus, Reply
from services.gateway.config import GatewayConfig
from services.gateway.core.context import RequestContext, note_error
from services.gateway.core.errors import ClientDisconnected
from services.gateway.http import error_dialects as responses
from services.gateway.http.endpoints import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    ENDPOINTS,
    PATHS,
    Endpoint,
)
from services.gateway.http.error_dialects import ErrorDialect
from shared.errors import (
    InternalError,
    ModelNotFound,
    ServiceError,
)
from shared.messages import CountTokens, Preprocess, ResponseChunk

log = structlog.get_logger(__name__)

__all__ = ["CHAT_PATH", "COMPLETIONS_PATH", "PATHS", "Readiness", "Relay"]

MAX_BODY_BYTES = 10_000_000
"""Litestar's default ``request_max_body_size``, so the limit is the same on every route."""

_ALLOW_POST = {"Allow": "POST"}
_JSON = (b"content-type", b"application/json")
_SSE_START = (
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
)


@dataclass(slots=True)
class Readiness:
    """Whether the gateway wants new work; flipped once on SIGTERM. Draining, it says so on
    ``/health`` and gRPC readiness (load balancers stop sending) and closes its listeners; an
    HTTP request that still reaches it is served within the grace period, a new gRPC call on a
    kept connection is refused UNAVAILABLE (as after a GOAWAY; gRPC clients retry it)."""

    is_shutting_down: bool = False

    def begin_shutdown(self) -> None:
        if not self.is_shutting_down:
            self.is_shutting_down = True
            log.info("shutdown_started")


class _HttpError(Exception):
    """One of the errors Litestar itself raises while reading a body (413, 400, 500)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class Relay:
    """One inference request, from its body to the last byte of its response."""

    __slots__ = (
        "_allow_unknown",
        "_bus",
        "_first_timeout_s",
        "_idle_timeout_s",
        "_readiness",
    )

    def __init__(self, config: GatewayConfig, bus: GatewayBus, readiness: Readiness) -> None:
        self._bus = bus
        self._readiness = readiness
        self._first_timeout_s = config.request_timeout_s
        self._idle_timeout_s = config.stream_idle_timeout_s
        self._allow_unknown = config.allow_unknown_fields

    async def serve(
        self, ctx: RequestContext, scope: HTTPScope, receive: Receive, send: Send
    ) -> None:
        """Submit the request, then relay its replies; every failure becomes a response."""
        endpoint = ENDPOINTS[ctx.path]
        dialect = endpoint.dialect
        rid = ctx.request_id
        if scope["method"] != "POST":
            parts = responses.http_error(
                405, "", scope["method"], ctx.path, _ALLOW_POST, dialect, rid
            )
            await _send_error(ctx, send, parts, dialect)
            return
        try:
            if endpoint.kind == "count_tokens":
                await self._count_tokens(ctx, endpoint, scope, receive, send)
                return
            preprocess, reply = await self._submit(ctx, endpoint, scope, receive)
        except ServiceError as exc:
            await _send_error(ctx, send, responses.service_error(exc, dialect, rid), dialect)
            return
        except _HttpError as exc:
            parts = responses.http_error(
                exc.status, exc.detail, "POST", ctx.path, None, dialect, rid
            )
            await _send_error(ctx, send, parts, dialect)
            return
        except Exception as exc:  # noqa: BLE001 - a bug: unexpected_error logs it once
            await _send_error(ctx, send, responses.unexpected_error(exc, dialect, rid), dialect)
            return
        listener = asyncio.get_running_loop().create_task(_watch(receive, reply))
        try:
            await self._respond(ctx, reply, preprocess.output.stream, send, dialect)
        finally:
            listener.cancel()

    async def _prepare(
        self, ctx: RequestContext, endpoint: Endpoint, scope: HTTPScope, receive: Receive
    ) -> Preprocess:
        """Read and parse the body, check the model, make the bus request."""
        body = await _read_body(scope, receive)
        headers = routing_headers(scope["headers"])
        parsed = endpoint.parse(body, headers, self._allow_unknown)
        ctx.model = parsed.model
        if endpoint.kind == "count_tokens":
            # Counting needs the model's tokenizer, not a live worker.
            if (
                not self._bus.is_live(parsed.model)
                and await self._bus.model_card(parsed.model) is None
            ):
                raise ModelNotFound(parsed.model)
        else:
            await self._bus.check_model(parsed.model)
        ctx.bus_id = self._bus.bus_id(ctx.request_id)
        now = time.time()
        return parsed.to_preprocess(
            request_id=ctx.bus_id,
            reply_to=self._bus.reply_subject(ctx.bus_id),
            created=int(now),
            deadline_ms=int((now + self._first_timeout_s) * 1000),
        )

    async def _submit(
        self, ctx: RequestContext, endpoint: Endpoint, scope: HTTPScope, receive: Receive
    ) -> tuple[Preprocess, Reply]:
        """Prepare the request, then publish it."""
        preprocess = await self._prepare(ctx, endpoint, scope, receive)
        return preprocess, await self._bus.submit(preprocess)

    async def _count_tokens(
        self,
        ctx: RequestContext,
        endpoint: Endpoint,
        scope: HTTPScope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Ask the preprocessors for the request's prompt tokens; answer ``{"input_tokens"}``."""
        preprocess = await self._prepare(ctx, endpoint, scope, receive)
        ask = CountTokens(request_id=ctx.bus_id, request=preprocess)
        tokens = await self._bus.count_tokens(ask, self._first_timeout_s)
        ctx.mark_first_response()
        ctx.prompt_tokens = tokens
        body = msgspec.json.encode({"input_tokens": tokens})
        headers = [_JSON, (b"content-length", b"%d" % len(body)), *endpoint.dialect.headers(ctx)]
        await _start(ctx, send, 200, headers)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _respond(
        self, ctx: RequestContext, reply: Reply, stream: bool, send: Send, dialect: ErrorDialect
    ) -> None:
        """Wait for the first event, then answer with it (JSON) or start the SSE stream."""
        rid = ctx.request_id
        try:
            first = await reply.next(self._first_timeout_s)
            ctx.mark_first_response()
            if not stream:
                last = first if first.done else await self._joined(reply, first)
                reply.close()
        except ClientDisconnected as exc:
            reply.cancel("client_disconnected")
            await _send_error(ctx, send, responses.service_error(exc, dialect, rid), dialect)
            return
        except ServiceError as exc:
            await _send_error(ctx, send, responses.service_error(exc, dialect, rid), dialect)
            return
        except asyncio.CancelledError:
            reply.cancel("cancelled")
            raise
        except Exception as exc:  # noqa: BLE001 - a bug: unexpected_error logs it once
            reply.cancel("internal_error")
            await _send_error(ctx, send, responses.unexpected_error(exc, dialect, rid), dialect)
            return
        if not stream:
            ctx.prompt_tokens, ctx.completion_tokens = last.prompt_tokens, last.completion_tokens
            body = last.data
            headers = [_JSON, (b"content-length", b"%d" % len(body)), *dialect.headers(ctx)]
            await _start(ctx, send, 200, headers)
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await _start(ctx, send, 200, [*_SSE_START, *dialect.headers(ctx)])
        await self._stream(ctx, reply, first, send, dialect)

    async def _joined(self, reply: Reply, first: ResponseChunk) -> ResponseChunk:
        """A non-streamed body sent in several chunks (the formatter normally sends one), as one."""
        parts = [first.data]
        chunk = first
        while not chunk.done:
            chunk = await reply.next(self._idle_timeout_s)
            parts.append(chunk.data)
        return ResponseChunk(
            request_id=chunk.request_id,
            data=b"".join(parts),
            done=True,
            prompt_tokens=chunk.prompt_tokens,
            completion_tokens=chunk.completion_tokens,
        )

    async def _stream(
        self,
        ctx: RequestContext,
        reply: Reply,
        first: ResponseChunk,
        send: Send,
        dialect: ErrorDialect,
    ) -> None:
        """Relay SSE bytes until ``done``; a failure ends the stream with an error event.

        Chunks that are already queued go out in one body message (one socket write); the
        bytes are the same, only their grouping into HTTP chunks differs. The last bytes go
        with ``more_body=False``, so the stream's end costs no write of its own.
        """
        idle_timeout_s = self._idle_timeout_s
        is_finished = False
        parts = [first.data]
        chunk = first
        sent = first.data  # the last chunk's bytes: a Responses error event is numbered after them
        try:
            while not chunk.done:
                if not reply.ready:  # nothing more queued: flush, then wait
                    body = parts[0] if len(parts) == 1 else b"".join(parts)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                    parts.clear()
                chunk = await reply.next(idle_timeout_s)
                parts.append(chunk.data)
                sent = chunk.data
            is_finished = True
            ctx.prompt_tokens, ctx.completion_tokens = chunk.prompt_tokens, chunk.completion_tokens
        except ClientDisconnected:
            pass  # is_finished stays False: cancelled below, nothing more to send
        except ServiceError as exc:
            is_finished = True
            note_error(exc.code)
            log.warning("stream_failed", code=exc.code, message=exc.message)
            parts.append(dialect.stream_tail(exc, sent))
        except Exception as exc:  # the response started: report in-band, log once
            is_finished = True
            log.exception("stream_crashed")
            note_error("internal_error")
            reply.cancel("internal_error")
            crash = InternalError(f"Internal error: {type(exc).__name__}")
            parts.append(dialect.stream_tail(crash, sent))
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


async def _read_body(scope: HTTPScope, receive: Receive) -> bytes:
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


async def _send_error(
    ctx: RequestContext, send: Send, parts: responses.ErrorParts, dialect: ErrorDialect
) -> None:
    status, body, extra = parts
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in extra.items()
    ]
    headers += [_JSON, (b"content-length", b"%d" % len(body)), *dialect.headers(ctx)]
    await _start(ctx, send, status, headers)
    await send({"type": "http.response.body", "body": body, "more_body": False})
