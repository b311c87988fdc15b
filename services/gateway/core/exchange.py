"""One request on the bus, for both fronts (HTTP and gRPC) and every kind of request.

The only place that gives a request its bus id, reply subject and deadline (``envelope``), waits
for its first event, relays its chunks (those already queued go out in one write), asks a
model's workers in turn, and turns an abandoned wait into a ``Cancel`` with its reason:

- the client went away (HTTP disconnect, a reset gRPC stream, the serving task cancelled):
  ``client_disconnected``, or ``timeout`` when the client's own deadline has passed;
- a bug: ``internal_error``;
- an upstream error (``ServiceError``): already closed or cancelled by ``Reply``.

Every wait is bounded by the gateway's limits (``--request-timeout-s`` for the first event,
``--stream-idle-timeout-s`` for the next ones) and by the client's deadline when it has one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import structlog

from services.gateway.core.bus import Reply
from services.gateway.core.context import RequestContext, note_error
from services.gateway.core.errors import ClientDisconnected, NoResponders, no_live_worker
from services.gateway.core.port import GatewayBus
from shared.errors import ServiceError, UpstreamTimeout
from shared.messages import Preprocess, ResponseChunk, TensorInfer, TensorResult

log = structlog.get_logger(__name__)

T = TypeVar("T")
Write = Callable[[bytes], Awaitable[None]]

DEADLINE_SLACK_S = 0.05
"""grpc cancels a call at its deadline by its own timer, which can fire a little before our
``time.monotonic()`` reaches the deadline we computed from ``time_remaining()`` (seen under CI
load): a cancel this close to the deadline is the deadline."""


class KeepAlive(msgspec.Struct, frozen=True):
    """What a relayed stream writes after ``interval_s`` with nothing to send (an SSE comment),
    so proxies and clients keep an idle connection open."""

    interval_s: float
    data: bytes


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """What every bus request from the gateway carries."""

    request_id: str
    """The bus id (``GatewayBus.bus_id``): the client's id unless it reused a recent one."""
    reply_to: str
    created: int
    """Unix seconds."""
    deadline_ms: int
    """Unix milliseconds: after this, no service starts work on the request."""
    timeout_s: float
    """How long the gateway waits for the first event (or a request/reply's answer)."""
    deadline: float | None
    """The client's deadline (``time.monotonic()``), if it gave one."""


class Exchanges:
    """Opens each request's exchange with the gateway's time limits and the front's idea of
    "the client went away" (``client_gone``: exception types a write raises then)."""

    __slots__ = (
        "_bus",
        "_client_gone",
        "_clock",
        "_first_timeout_s",
        "_idle_timeout_s",
        "_keep_alive",
    )

    def __init__(
        self,
        bus: GatewayBus,
        *,
        first_timeout_s: float,
        idle_timeout_s: float,
        client_gone: tuple[type[BaseException], ...] = (),
        clock: Callable[[], float] = time.monotonic,
        keep_alive: KeepAlive | None = None,
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._keep_alive = keep_alive
        self._first_timeout_s = first_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._client_gone: tuple[type[BaseException], ...] = (asyncio.CancelledError, *client_gone)

    @property
    def bus(self) -> GatewayBus:
        return self._bus

    def envelope(self, ctx: RequestContext, deadline: float | None = None) -> Envelope:
        """A new bus id for the request (also in ``ctx.bus_id``), its reply subject and time
        limits; ``deadline``: the client's (``time.monotonic()``)."""
        timeout_s = wait_s(self._first_timeout_s, deadline)
        ctx.bus_id = bus_id = self._bus.bus_id(ctx.request_id)
        now = time.time()
        return Envelope(
            request_id=bus_id,
            reply_to=self._bus.reply_subject(bus_id),
            created=int(now),
            deadline_ms=int((now + timeout_s) * 1000),
            timeout_s=timeout_s,
            deadline=deadline,
        )

    def addressed(
        self, ctx: RequestContext, to_preprocess: Callable[..., Preprocess]
    ) -> tuple[Preprocess, Envelope]:
        """A new envelope (``envelope``) and the bus request ``to_preprocess`` makes with its
        id, reply subject, creation time and deadline."""
        envelope = self.envelope(ctx)
        request = to_preprocess(
            request_id=envelope.request_id,
            reply_to=envelope.reply_to,
            created=envelope.created,
            deadline_ms=envelope.deadline_ms,
        )
        return request, envelope

    async def submit(
        self, ctx: RequestContext, request: Preprocess, envelope: Envelope
    ) -> Exchange:
        """Publish ``request`` (made with ``envelope``) down the pipeline."""
        reply = await self._bus.submit(request)
        return Exchange(
            reply, ctx, envelope, self._idle_timeout_s, self._client_gone, self._keep_alive
        )

    async def in_turn(
        self, model: str, envelope: Envelope, ask: Callable[[str, float], Awaitable[T]]
    ) -> T:
        """``ask(worker_id, timeout_s)`` the model's live workers in round-robin turn until one
        answers; one that has just gone ("no responders") passes to the next. Bounded by the
        envelope's time limit over all the attempts."""
        workers = self._bus.workers_in_turn(model)
        if not workers:
            raise no_live_worker(model)
        ends = self._clock() + envelope.timeout_s
        for attempt, worker_id in enumerate(workers, start=1):
            left = ends - self._clock()
            if left <= 0:
                break
            try:
                return await ask(worker_id, left)
            except NoResponders:
                if attempt == len(workers):
                    raise
                log.debug("worker_unreachable", worker_id=worker_id, model=model)
        raise UpstreamTimeout(f"No response from upstream within {envelope.timeout_s:g}s.")

    async def tensor(self, infer: TensorInfer, envelope: Envelope) -> TensorResult:
        """A tensor model's result from one of its workers, in turn."""

        async def ask(worker_id: str, timeout_s: float) -> TensorResult:
            reply = await self._bus.submit_tensor(infer, worker_id)
            try:
                result = await reply.result(timeout_s)
            except BaseException as exc:  # "no responders" included: closed by the reply
                abandon(reply, exc, envelope.deadline, self._client_gone)
                raise
            reply.close()
            return result

        return await self.in_turn(infer.model, envelope, ask)


class Exchange:
    """One submitted request's replies: the first event, then the rest relayed or joined.

    After a failure mid-relay, ``unwritten`` holds the bytes not yet written and ``last_data``
    the last chunk's (an error event in the stream is written after them).
    """

    __slots__ = ("_client_gone", "_ctx", "_idle_timeout_s", "_keep_alive", "_reply", "envelope",
                 "last_data", "unwritten")  # fmt: skip

    def __init__(
        self,
        reply: Reply,
        ctx: RequestContext,
        envelope: Envelope,
        idle_timeout_s: float,
        client_gone: tuple[type[BaseException], ...],
        keep_alive: KeepAlive | None = None,
    ) -> None:
        self._reply = reply
        self._keep_alive = keep_alive
        self._ctx = ctx
        self.envelope = envelope
        self._idle_timeout_s = idle_timeout_s
        self._client_gone = client_gone
        self.unwritten = b""
        self.last_data = b""

    async def first(self) -> ResponseChunk:
        """The first event (bounded by the envelope's limit); marks the time to first response."""
        try:
            chunk = await self._reply.next(self.envelope.timeout_s)
        except BaseException as exc:
            self.abandon(exc)
            raise
        self._ctx.mark_first_response()
        self.last_data = chunk.data
        return chunk

    async def relay(
        self, first: ResponseChunk, write: Write | None = None
    ) -> tuple[ResponseChunk, bytes]:
        """The chunks from ``first`` to the done one: that chunk, and the bytes not written.

        With ``write``, the bytes already queued go out in one write whenever the queue runs
        dry; without, every chunk's bytes are joined (a whole response). Closes the reply at
        the end; on a failure, cancels it with its reason and raises.
        """
        reply = self._reply
        idle_s, deadline = self._idle_timeout_s, self.envelope.deadline
        parts: list[bytes] = []
        chunk = first
        try:
            while True:
                if chunk.data:
                    parts.append(chunk.data)
                    self.last_data = chunk.data
                if chunk.done:
                    break
                if write is not None and parts and not reply.ready:
                    data = joined(parts)
                    parts.clear()
                    await write(data)
                limit_s = idle_s if deadline is None else wait_s(idle_s, deadline)
                if write is not None and self._keep_alive is not None:
                    limit_s = await self._kept_alive(limit_s, self._keep_alive, write)
                chunk = await reply.next(limit_s)
        except BaseException as exc:
            self.unwritten = joined(parts)
            self.abandon(exc)
            raise
        reply.close()
        self._ctx.prompt_tokens = chunk.prompt_tokens
        self._ctx.completion_tokens = chunk.completion_tokens
        return chunk, joined(parts)

    async def _kept_alive(self, limit_s: float, keep_alive: KeepAlive, write: Write) -> float:
        """Until a reply is in: write the keep-alive every ``interval_s`` of silence. What is
        left of the idle limit ``limit_s`` (which the keep-alives do not extend)."""
        reply = self._reply
        ends = time.monotonic() + limit_s
        while not reply.ready:
            left = ends - time.monotonic()
            if left <= keep_alive.interval_s or await reply.wait(keep_alive.interval_s):
                break
            await write(keep_alive.data)
        return max(0.0, ends - time.monotonic())

    def interrupt(self, error: ServiceError) -> None:
        """Make the pending (or next) wait raise ``error`` after the replies already in."""
        self._reply.interrupt(error)

    def abandon(self, exc: BaseException) -> None:
        """Stop a request that will not be answered, with the reason ``exc`` gives."""
        abandon(self._reply, exc, self.envelope.deadline, self._client_gone)


def abandon(
    reply: Reply,
    exc: BaseException,
    deadline: float | None,
    client_gone: tuple[type[BaseException], ...],
) -> None:
    """Cancel ``reply`` for ``exc``: the client went away (``client_disconnected``, or
    ``timeout`` past its deadline), a bug (``internal_error``); an upstream ``ServiceError`` has
    closed or cancelled it already."""
    if isinstance(exc, (ClientDisconnected, *client_gone)):
        reason = "timeout" if _is_past(deadline) else ClientDisconnected.code
        note_error(reason)
        reply.cancel(reason)
    elif not isinstance(exc, ServiceError):
        reply.cancel("internal_error")


def wait_s(limit_s: float, deadline: float | None) -> float:
    """``limit_s``, or less when the client's deadline comes first."""
    if deadline is None:
        return limit_s
    return max(0.0, min(limit_s, deadline - time.monotonic()))


def _is_past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline - DEADLINE_SLACK_S


def joined(parts: list[bytes]) -> bytes:
    """The parts as one bytes object (no copy for one part)."""
    return parts[0] if len(parts) == 1 else b"".join(parts)
