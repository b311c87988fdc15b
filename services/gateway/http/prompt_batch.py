"""A completions request with several prompts (decision 030), raw ASGI: one exchange per prompt,
answered as one response (``apis/prompt_batches.py`` merges and renumbers).

Every prompt's first event is awaited before anything is answered, so a failure before then
(an unknown model, a prompt over the context) is the whole request's error, with its status, and
the other prompts are cancelled. Streaming, the prompts' chunks are relayed as they come, each
renumbered, one write at a time; a failure mid-stream cancels the others and ends the stream with
the error event. A client that goes away cancels them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog
from litestar.types import Receive, Send

from services.gateway.apis.prompt_batches import BatchStream, merged_body
from services.gateway.core.context import RequestContext, note_error
from services.gateway.core.errors import ClientDisconnected
from services.gateway.core.exchange import Exchange
from shared.errors import InternalError, ServiceError
from shared.messages import ResponseChunk

log = structlog.get_logger(__name__)

Submit = Callable[[], Awaitable[Exchange]]


class _Cancelled(Exception):
    """Why a prompt's exchange is dropped: another prompt of the batch failed."""


async def open_batch(submits: Sequence[Submit]) -> tuple[list[Exchange], list[ResponseChunk]]:
    """Submit every prompt and wait for each one's first event; on a failure, cancel the
    others and raise it."""
    exchanges: list[Exchange] = []
    try:
        for submit in submits:
            exchanges.append(await submit())  # noqa: PERF401 - those sent so far are cancelled
        firsts = [await exchange.first() for exchange in exchanges]
    except BaseException:
        for exchange in exchanges:
            exchange.abandon(_Cancelled())
        raise
    return exchanges, firsts


async def whole(
    ctx: RequestContext, exchanges: list[Exchange], firsts: list[ResponseChunk], n: int
) -> bytes:
    """Every prompt's answer, joined and merged into one body."""
    bodies: list[bytes] = []
    done: list[ResponseChunk] = []
    try:
        for exchange, first in zip(exchanges, firsts, strict=True):
            last, body = await exchange.relay(first)
            bodies.append(body)
            done.append(last)
    except BaseException:
        for exchange in exchanges[len(bodies) + 1 :]:
            exchange.abandon(_Cancelled())
        raise
    count_tokens(ctx, done)
    return merged_body(bodies, n)


async def streamed(
    ctx: RequestContext,
    exchanges: list[Exchange],
    firsts: list[ResponseChunk],
    n: int,
    send: Send,
    tail: Callable[[ServiceError], bytes],
) -> None:
    """Relay every prompt's stream at once, renumbered, then the closing bytes."""
    merger = BatchStream(n)
    lock = asyncio.Lock()
    done: list[ResponseChunk] = []

    async def write(data: bytes) -> None:
        if data:
            async with lock:
                await send({"type": "http.response.body", "body": data, "more_body": True})

    async def one(index: int) -> None:
        async def renumbered(data: bytes) -> None:
            await write(merger.rewrite(index, data))

        last, rest = await exchanges[index].relay(firsts[index], renumbered)
        done.append(last)
        await renumbered(rest)

    tasks = [asyncio.ensure_future(one(i)) for i in range(len(exchanges))]
    try:
        await asyncio.gather(*tasks)
        count_tokens(ctx, done)
        end = merger.closing()
    except ClientDisconnected:
        _cancel(tasks)
        return
    except ServiceError as exc:
        _cancel(tasks)
        note_error(exc.code)
        log.warning("stream_failed", code=exc.code, message=exc.message)
        end = tail(exc)
    except Exception as exc:  # the response started: report in-band, log once
        _cancel(tasks)
        log.exception("stream_crashed")
        note_error("internal_error")
        end = tail(InternalError(f"Internal error: {type(exc).__name__}"))
    async with lock:
        await send({"type": "http.response.body", "body": end, "more_body": False})


def _cancel(tasks: Sequence[asyncio.Future[None]]) -> None:
    for task in tasks:
        task.cancel()


async def watch(receive: Receive, exchanges: list[Exchange]) -> None:
    """Until cancelled: on ``http.disconnect``, end every prompt's exchange."""
    while (await receive())["type"] != "http.disconnect":
        pass
    for exchange in exchanges:
        exchange.interrupt(ClientDisconnected("The client closed the connection."))


def count_tokens(ctx: RequestContext, done: list[ResponseChunk]) -> None:
    """The access line's token counts: the whole batch's (each relay noted its own)."""
    ctx.prompt_tokens = sum(chunk.prompt_tokens for chunk in done)
    ctx.completion_tokens = sum(chunk.completion_tokens for chunk in done)
