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
callbacks one at a time). Raw nats-py stays the transport; what the wrapper costs over a bare
callback is measured by ``bench/handler_cost.py`` (decision 014).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from structlog.contextvars import bind_contextvars, reset_contextvars

from shared import codec
from shared.errors import InternalError, InvalidRequest, ServiceError
from shared.metrics import ServiceMetrics
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

    def wrap(
        self,
        kind: str,
        fn: Callable[[M], Awaitable[None]],
        *,
        reply_to: Callable[[M], str | None] | None = None,
        after_failure: Callable[[M, ServiceError], Awaitable[None]] | None = None,
    ) -> Callable[[M], Coroutine[Any, Any, None]]:
        """``fn`` behind the boundary, for a message already decoded (e.g. work handed to a task
        after a handler's fast path): bind, count and time, failures answered and logged."""
        stats = self.metrics.handlers.labels(self.service, kind)
        failed = _Failure(self, kind, reply_to, after_failure)
        request_id_var = _REQUEST_ID

        async def handle(message: M) -> None:
            request_id: str | None = getattr(message, "request_id", None)
            token = request_id_var.set(request_id) if request_id is not None else None
            started = time.perf_counter()
            try:
                await fn(message)
            except ServiceError as exc:
                log.warning("request_failed", code=exc.code, status=exc.status, error=exc.message)
                await failed(message, request_id, exc)
            except Exception:  # the handler boundary: log once with the traceback, answer
                log.exception("request_crashed", kind=kind)
                await failed(message, request_id, InternalError(failed.crash_message))
            finally:
                stats.observe(time.perf_counter() - started)
                if token is not None:
                    request_id_var.reset(token)

        return handle

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
        decode = decoder.decode
        handle = self.wrap(kind, fn, reply_to=reply_to, after_failure=after_failure)

        if tasks is None:

            async def on_message(msg: Msg) -> None:
                try:
                    message = decode(msg.data)
                except codec.DecodeError as exc:
                    await self.undecodable(msg, kind, exc)
                    return
                await handle(message)

            return on_message

        spawn = tasks.spawn

        async def on_message_in_task(msg: Msg) -> None:
            try:
                message = decode(msg.data)
            except codec.DecodeError as exc:
                await self.undecodable(msg, kind, exc)
                return
            spawn(handle(message))

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


class _Failure(Generic[M]):
    """What happens after a handler failed: count, reply with ``RequestFailed``, clean up."""

    __slots__ = ("_after", "_boundary", "_kind", "_reply_to", "crash_message")

    def __init__(
        self,
        boundary: Boundary,
        kind: str,
        reply_to: Callable[[M], str | None] | None,
        after: Callable[[M, ServiceError], Awaitable[None]] | None,
    ) -> None:
        self._boundary = boundary
        self._kind = kind
        self._reply_to = reply_to
        self._after = after
        self.crash_message = f"the {boundary.service} failed on this request"

    async def __call__(self, message: M, request_id: str | None, exc: ServiceError) -> None:
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


def _request_id_var() -> ContextVar[Any]:
    """structlog's context variable for ``request_id`` (public API: a bind's token names it).

    Setting it directly per message costs a third of ``bind_contextvars``/``reset_contextvars``.
    """
    tokens = bind_contextvars(request_id=None)
    reset_contextvars(**tokens)
    var: ContextVar[Any] = tokens["request_id"].var
    return var


_REQUEST_ID = _request_id_var()
