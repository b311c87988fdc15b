"""The handler boundary of every bus service: decode, bind, time, and turn failures into replies.

``Boundary.handler`` wraps a service's own logic (``async def fn(message)``) into the nats-py
callback for a subscription. The wrapper, written once here, does what every handler needs:

- decode ``msg.data`` with a typed decoder; an undecodable message is logged once
  (``message_undecodable``), counted, and answered with ``invalid_request`` when it has a reply
  subject (the sender's request then fails at once instead of timing out);
- bind the message's ``request_id`` into the log context for everything the handler does;
- count and time the message (``jetserve_messages_total`` / ``jetserve_handler_seconds``);
- a ``ServiceError`` is logged as ``request_failed`` (warning, with its code and status),
  counted, and sent as ``RequestFailed`` to ``reply_to(message)``; anything else is logged once
  with its traceback as ``request_crashed`` and sent as ``internal_error``. ``after_failure``
  runs after either (e.g. a worker tells routers the request is over).

With ``tasks`` each message is handled in a task of its own (nats-py awaits a subscription's
callbacks one at a time). The wrapper costs about a microsecond a message over a hand-written
callback (``bench/handler_cost.py``); raw nats-py stays the transport (decision 001, 014).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from structlog.contextvars import bind_contextvars, reset_contextvars

from shared import codec
from shared.errors import InternalError, InvalidRequest, ServiceError
from shared.metrics import KindStats, ServiceMetrics
from shared.subjects import request_id_of
from shared.tasks import TaskSet

log = structlog.get_logger(__name__)

M = TypeVar("M")
Callback = Callable[[Msg], Awaitable[None]]


class Boundary:
    """One service's handler boundary: its connection (for failure replies) and its metrics."""

    __slots__ = ("_nc", "metrics", "service")

    def __init__(self, nc: Client, metrics: ServiceMetrics) -> None:
        self._nc = nc
        self.metrics = metrics
        self.service = metrics.service

    def handler(
        self,
        decoder: codec.Decoder[M],
        kind: str,
        fn: Callable[[M], Awaitable[None]],
        *,
        reply_to: Callable[[M], str | None] | None = None,
        after_failure: Callable[[M, ServiceError], Awaitable[None]] | None = None,
        tasks: TaskSet | None = None,
    ) -> Callback:
        """The subscription callback running ``fn`` on each decoded message of ``kind``."""
        handling = _Handling(self, kind, fn, reply_to, after_failure)
        decode = decoder.decode
        stats = self.metrics.handlers.labels(self.service, kind)

        if tasks is None:

            async def on_message(msg: Msg) -> None:
                try:
                    message = decode(msg.data)
                except codec.DecodeError as exc:
                    await self.undecodable(msg, kind, exc)
                    return
                await handling.run(message, stats)

            return on_message

        spawn = tasks.spawn

        async def on_message_in_task(msg: Msg) -> None:
            try:
                message = decode(msg.data)
            except codec.DecodeError as exc:
                await self.undecodable(msg, kind, exc)
                return
            spawn(handling.run(message, stats))

        return on_message_in_task

    async def undecodable(self, msg: Msg, kind: str, exc: Exception) -> None:
        """Log and count a message that is not what its subject carries; answer if it can be."""
        self.metrics.error("message_undecodable")
        log.warning("message_undecodable", subject=msg.subject, kind=kind, error=str(exc))
        if msg.reply:
            failure = InvalidRequest(f"undecodable {kind} message: {exc}")
            await self.publish_failure(msg.reply, failure.to_message(request_id_of(msg.reply)))

    async def fail(self, subject: str | None, request_id: str, exc: ServiceError) -> None:
        """Log, count and send one request's typed failure to ``subject`` (if any)."""
        self.metrics.error(exc.code)
        log.warning("request_failed", code=exc.code, status=exc.status, error=exc.message)
        if subject:
            await self.publish_failure(subject, exc.to_message(request_id))

    async def publish_failure(self, subject: str, failure: Any) -> None:
        """Publish an encoded failure; a bus error is logged, never raised (we are failing)."""
        try:
            await self._nc.publish(subject, codec.encode(failure))
        except nats.errors.Error as exc:
            log.warning("reply_failed", subject=subject, error=str(exc))


class _Handling(Generic[M]):
    """Runs one kind's handler on a decoded message: bind, time, catch."""

    __slots__ = ("_after", "_boundary", "_fn", "_kind", "_reply_to")

    def __init__(
        self,
        boundary: Boundary,
        kind: str,
        fn: Callable[[M], Awaitable[None]],
        reply_to: Callable[[M], str | None] | None,
        after: Callable[[M, ServiceError], Awaitable[None]] | None,
    ) -> None:
        self._boundary = boundary
        self._kind = kind
        self._fn = fn
        self._reply_to = reply_to
        self._after = after

    async def run(self, message: M, stats: KindStats) -> None:
        request_id: str | None = getattr(message, "request_id", None)
        tokens = bind_contextvars(request_id=request_id) if request_id is not None else None
        started = time.perf_counter()
        try:
            await self._fn(message)
        except ServiceError as exc:
            log.warning("request_failed", code=exc.code, status=exc.status, error=exc.message)
            await self._failed(message, request_id, exc)
        except Exception:  # the handler boundary: log once with the traceback, answer, carry on
            log.exception("request_crashed", kind=self._kind)
            failure = InternalError(f"the {self._boundary.service} failed on this request")
            await self._failed(message, request_id, failure)
        finally:
            stats.observe(time.perf_counter() - started)
            if tokens is not None:
                reset_contextvars(**tokens)

    async def _failed(self, message: M, request_id: str | None, exc: ServiceError) -> None:
        boundary = self._boundary
        boundary.metrics.error(exc.code)
        subject = self._reply_to(message) if self._reply_to is not None else None
        if subject and request_id is not None:
            await boundary.publish_failure(subject, exc.to_message(request_id))
        if self._after is not None:
            try:
                await self._after(message, exc)
            except Exception:  # a failing clean-up must not hide the failure
                log.exception("failure_cleanup_crashed", kind=self._kind)
