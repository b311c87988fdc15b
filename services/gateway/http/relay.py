"""The inference request lifecycle, raw ASGI, for every path in ``endpoints.endpoints()``: OpenAI
chat and completions, Anthropic Messages (and ``count_tokens``), the Responses API.

Read the body (with Litestar's checks), parse, submit, wait for the first event, then answer
with a JSON body or an SSE stream; an error before the first event gets its real status, one
after the headers ends the stream in-band, each in the endpoint's error dialect. A timeout or a
client disconnect cancels upstream. ``count_tokens`` asks the preprocessors instead (request/
reply) and answers ``{"input_tokens": N}``. A Responses turn is opened with the conversation it
continues and kept before its last bytes go out (``core/turns.py``, decision 030).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

import msgspec
import structlog
from litestar.types import HTTPScope, Receive, Send

from services.gateway.apis import lora_admin
from services.gateway.apis.admission_hints import AdmissionReader
from services.gateway.apis.nvext import routing_headers
from services.gateway.config import GatewayConfig
from services.gateway.core.context import RequestContext, note_error
from services.gateway.core.errors import ClientDisconnected
from services.gateway.core.exchange import Envelope, Exchange, Exchanges
from services.gateway.core.port import GatewayBus
from services.gateway.core.turn_store import MemoryTurns
from services.gateway.core.turns import Turn, Turns
from services.gateway.http import error_dialects as responses
from services.gateway.http import prompt_batch
from services.gateway.http.endpoints import Endpoint, Parsed
from services.gateway.http.error_dialects import ErrorDialect
from shared.errors import (
    InternalError,
    ModelNotFound,
    ServiceError,
)
from shared.messages import CountTokens, Preprocess, ResponseChunk

log = structlog.get_logger(__name__)


_ALLOW_POST = {"Allow": "POST"}
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


class Relay:
    """One inference request, from its body to the last byte of its response."""

    __slots__ = (
        "_admission",
        "_allow_unknown",
        "_endpoints",
        "_exchanges",
        "_max_body_bytes",
        "_turns",
    )

    def __init__(
        self,
        config: GatewayConfig,
        exchanges: Exchanges,
        table: dict[str, Endpoint],
        turns: Turns | None = None,
    ) -> None:
        self._exchanges = exchanges
        self._turns = turns or Turns(MemoryTurns())
        self._endpoints = table
        self._allow_unknown = config.allow_unknown_fields
        self._max_body_bytes = config.max_body_bytes
        self._admission = AdmissionReader(
            config.admission_policy() if config.admission_config is not None else None
        )

    async def serve(
        self, ctx: RequestContext, scope: HTTPScope, receive: Receive, send: Send
    ) -> None:
        """Submit the request, then relay its replies; every failure becomes a response."""
        endpoint = self._endpoints[ctx.path]
        dialect = endpoint.dialect
        rid = ctx.request_id
        if scope["method"] != "POST":
            parts = responses.http_error(
                405, "", scope["method"], ctx.path, _ALLOW_POST, dialect, rid
            )
            await _send_error(ctx, send, parts, dialect)
            return
        try:
            preprocess = await self._prepare(ctx, endpoint, scope, receive)
            if endpoint.kind == "count_tokens":
                await self._count_tokens(ctx, preprocess, endpoint, send)
                return
            if preprocess.batch:
                await self._batch(ctx, preprocess, receive, send, dialect)
                return
            exchange = await self._exchanges.submit(ctx, preprocess.request, preprocess.envelope)
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
        listener = asyncio.get_running_loop().create_task(_watch(receive, exchange))
        try:
            await self._respond(
                ctx, exchange, preprocess.request.output.stream, send, dialect, preprocess.turn
            )
        finally:
            listener.cancel()

    async def _prepare(
        self, ctx: RequestContext, endpoint: Endpoint, scope: HTTPScope, receive: Receive
    ) -> _Prepared:
        """Read and parse the body, check the model, make the bus request."""
        body = await _read_body(scope, receive, self._max_body_bytes)
        headers = routing_headers(scope["headers"], self._admission)
        parsed = endpoint.parse(body, headers, self._allow_unknown)
        ctx.model = parsed.model
        bus = self._exchanges.bus
        parent = None if bus.is_live(parsed.model) else _adapter_parent(bus, parsed.model)
        if endpoint.kind == "count_tokens" and parent is None:
            # Counting needs the model's tokenizer, not a live worker.
            if not bus.is_live(parsed.model) and await bus.model_card(parsed.model) is None:
                raise ModelNotFound(parsed.model)
        elif parent is None:
            await bus.check_model(parsed.model)
        if parsed.batch:
            return self._batch_requests(ctx, parsed, parent)
        turn = None
        to_preprocess = parsed.to_preprocess
        if parsed.turn is not None:
            turn = await self._turns.begin(parsed.turn, headers)
            to_preprocess = turn.to_preprocess
        request, envelope = self._exchanges.addressed(ctx, to_preprocess)
        if parent is not None:  # a LoRA adapter's name: its base model, routed to its holders
            request = lora_admin.for_adapter(request, parent)
        return _Prepared(request, envelope, turn)

    def _batch_requests(self, ctx: RequestContext, parsed: Parsed, parent: str | None) -> _Prepared:
        """One bus request per prompt, each with its own envelope (for an adapter's name, as
        ``_prepare`` makes one)."""
        batch = []
        for to_preprocess in parsed.batch:
            request, envelope = self._exchanges.addressed(ctx, to_preprocess)
            if parent is not None:
                request = lora_admin.for_adapter(request, parent)
            batch.append((request, envelope))
        first, envelope = batch[0]
        return _Prepared(first, envelope, batch=tuple(batch), choices=parsed.choices)

    async def _batch(
        self,
        ctx: RequestContext,
        prepared: _Prepared,
        receive: Receive,
        send: Send,
        dialect: ErrorDialect,
    ) -> None:
        """A completions request with several prompts (``prompt_batch.py``)."""
        rid = ctx.request_id
        submits = [
            partial(self._exchanges.submit, ctx, request, envelope)
            for request, envelope in prepared.batch
        ]
        try:
            exchanges, firsts = await prompt_batch.open_batch(submits)
        except ServiceError as exc:
            await _send_error(ctx, send, responses.service_error(exc, dialect, rid), dialect)
            return
        listener = asyncio.get_running_loop().create_task(prompt_batch.watch(receive, exchanges))
        try:
            if not prepared.request.output.stream:
                try:
                    body = await prompt_batch.whole(ctx, exchanges, firsts, prepared.choices)
                except ServiceError as exc:
                    parts = responses.service_error(exc, dialect, rid)
                    await _send_error(ctx, send, parts, dialect)
                    return
                await _send_json(ctx, send, 200, body, dialect)
                return
            await _start(ctx, send, 200, [*_SSE_START, *dialect.headers(ctx)])
            tail = partial(dialect.stream_tail, sent=b"")
            await prompt_batch.streamed(ctx, exchanges, firsts, prepared.choices, send, tail)
        finally:
            listener.cancel()

    async def _count_tokens(
        self, ctx: RequestContext, prepared: _Prepared, endpoint: Endpoint, send: Send
    ) -> None:
        """Ask the preprocessors for the request's prompt tokens; answer ``{"input_tokens"}``."""
        ask = CountTokens(request_id=prepared.envelope.request_id, request=prepared.request)
        tokens = await self._exchanges.bus.count_tokens(ask, prepared.envelope.timeout_s)
        ctx.mark_first_response()
        ctx.prompt_tokens = tokens
        body = msgspec.json.encode({"input_tokens": tokens})
        await _send_json(ctx, send, 200, body, endpoint.dialect)

    async def _respond(
        self,
        ctx: RequestContext,
        exchange: Exchange,
        stream: bool,
        send: Send,
        dialect: ErrorDialect,
        turn: Turn | None = None,
    ) -> None:
        """Wait for the first event, then answer with it (JSON) or start the SSE stream; a
        Responses turn is kept before its last bytes go out."""
        rid = ctx.request_id
        try:
            first = await exchange.first()
            if not stream:
                _, body = await exchange.relay(first)
                if turn is not None:
                    await self._turns.keep(turn, body, stream=False)
        except ServiceError as exc:
            await _send_error(ctx, send, responses.service_error(exc, dialect, rid), dialect)
            return
        except Exception as exc:  # noqa: BLE001 - a bug: unexpected_error logs it once
            await _send_error(ctx, send, responses.unexpected_error(exc, dialect, rid), dialect)
            return
        if not stream:
            await _send_json(ctx, send, 200, body, dialect)
            return
        await _start(ctx, send, 200, [*_SSE_START, *dialect.headers(ctx)])
        keep = None if turn is None else partial(self._turns.keep, turn, stream=True)
        await _stream(exchange, first, send, dialect, keep)


async def _stream(
    exchange: Exchange,
    first: ResponseChunk,
    send: Send,
    dialect: ErrorDialect,
    keep: Callable[[bytes], Awaitable[None]] | None = None,
) -> None:
    """Relay SSE bytes until ``done``; a failure ends the stream with an error event.

    Chunks that are already queued go out in one body message (one socket write); the last
    bytes go with ``more_body=False``, so the stream's end costs no write of its own.
    """

    async def write(data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    try:
        done, rest = await exchange.relay(first, write)
        if keep is not None:
            await keep(done.data)  # before the last event reaches the client
    except ClientDisconnected:
        return  # cancelled by the exchange; nobody to send to
    except ServiceError as exc:
        note_error(exc.code)
        log.warning("stream_failed", code=exc.code, message=exc.message)
        rest = exchange.unwritten + dialect.stream_tail(exc, exchange.last_data)
    except Exception as exc:  # the response started: report in-band, log once
        log.exception("stream_crashed")
        note_error("internal_error")
        crash = InternalError(f"Internal error: {type(exc).__name__}")
        rest = exchange.unwritten + dialect.stream_tail(crash, exchange.last_data)
    await send({"type": "http.response.body", "body": rest, "more_body": False})


class _Prepared(msgspec.Struct, frozen=True):
    request: Preprocess
    envelope: Envelope
    turn: Turn | None = None
    batch: tuple[tuple[Preprocess, Envelope], ...] = ()
    """Completions with several prompts: every prompt's request (the first is ``request``)."""
    choices: int = 1


async def _watch(receive: Receive, exchange: Exchange) -> None:
    """Until cancelled: on ``http.disconnect``, make the exchange's next wait raise."""
    while (await receive())["type"] != "http.disconnect":
        pass
    exchange.interrupt(ClientDisconnected("The client closed the connection."))


async def _read_body(scope: HTTPScope, receive: Receive, max_bytes: int) -> bytes:
    """The whole body, with Litestar's checks (content-length, size limit, early disconnect)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            text = value.decode("latin-1")
            try:
                announced = int(text)
            except ValueError:
                raise _HttpError(400, f"Invalid content-length: {text!r}") from None
            if announced > max_bytes:
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
                if size > max_bytes:
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
    await _send_json(ctx, send, status, body, dialect, headers)


async def _send_json(
    ctx: RequestContext,
    send: Send,
    status: int,
    body: bytes,
    dialect: ErrorDialect,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """A whole JSON response: ``extra`` headers first, then type, length and the dialect's."""
    headers = [*(extra or ()), _JSON, (b"content-length", b"%d" % len(body)), *dialect.headers(ctx)]
    await _start(ctx, send, status, headers)
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _adapter_parent(bus: GatewayBus, name: str) -> str | None:
    """The base model of the LoRA adapter ``name`` held by a live worker (None: no such)."""
    for model in bus.live_models():
        adapter = lora_admin.adapters_of(bus.live_workers(model)).get(name)
        if adapter is not None:
            return adapter.parent
    return None
