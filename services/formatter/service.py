"""Formatter wiring on raw nats-py: StreamOpen handshake, token batches → ResponseChunk, cancel.

Per-token hot path (``on_stream``): decode, look up the request, format, publish. Everything
that decides something lives in ``request.py`` / ``detokenizer.py`` / ``chunks.py``.

``StreamOpen`` comes either as a queue-group request (answered with ``StreamOpened``) or on this
instance's direct subject, unanswered (decision 013). After a direct open the token batches may
arrive first: events for an unknown request are held briefly (``early.py``) and replayed, in
order, when its open arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.formatter.config import FormatterConfig
from services.formatter.early import EarlyEvents
from services.formatter.request import RequestFormatter
from services.formatter.tokenizer_cache import TokenizerCache
from shared import codec
from shared.bus import barrier, connect, wait_for_signal
from shared.errors import (
    ServiceError,
    ShuttingDown,
    UpstreamTimeout,
)
from shared.messages import (
    Cancel,
    FormatterLeaving,
    RequestFailed,
    ResponseChunk,
    StreamOpen,
    StreamOpened,
    TokenBatch,
    WorkerEvent,
)
from shared.metrics import ServiceMetrics, serve_metrics
from shared.recent import RecentIds
from shared.registry import ModelFiles
from shared.subjects import Subjects
from shared.warmup import ModelWarmer

log = structlog.get_logger(__name__)

QUEUE_GROUP = "formatter"
LEAVE_GRACE_S = 0.05
"""On shutdown, after telling preprocessors to stop direct opens, how long to keep taking the
ones already on their way before draining."""
DONE_TTL_S = 10.0
"""Finished or cancelled request ids are remembered this long: their late batches are dropped
at once instead of being held, and a ``StreamOpen`` that comes after its ``Cancel`` is ignored."""


class FormatterService:
    """One formatter instance: per-request state keyed by ``request_id``."""

    def __init__(
        self,
        config: FormatterConfig,
        nc: Client,
        *,
        subjects: Subjects,
        tokenizers: TokenizerCache,
        clock: Callable[[], float] = time.monotonic,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self._config = config
        self.metrics = metrics or ServiceMetrics("formatter")
        self.metrics.track_in_flight(lambda: len(self._states))
        self._nc = nc
        self._subjects = subjects
        self._tokenizers = tokenizers
        self._clock = clock
        self._states: dict[str, RequestFormatter] = {}
        self._subs: list[Subscription] = []
        self._open_sub: Subscription | None = None
        self._direct_sub: Subscription | None = None
        self._early = EarlyEvents()
        """Events that came before their request's direct ``StreamOpen``."""
        self._opening: set[str] = set()
        """Direct opens waiting for a tokenizer: their early events do not age out."""
        self._done = RecentIds(ttl_s=DONE_TTL_S)
        self._tasks: set[asyncio.Task[None]] = set()
        self._warmer: ModelWarmer | None = None
        self._closing = False
        self._drained = asyncio.Event()
        """Set, while closing, once the last in-flight request is gone."""

    @property
    def in_flight(self) -> int:
        """Requests opened and not yet finished."""
        return len(self._states)

    async def start(self) -> None:
        """Subscribe (stream and cancel first, so no batch for an opened stream is missed)."""
        nc, subjects = self._nc, self._subjects
        stream_all = subjects.stream_all(self._config.formatter_id)
        self._subs.append(await nc.subscribe(stream_all, cb=self.on_stream))
        self._subs.append(await nc.subscribe(subjects.cancel, cb=self.on_cancel))
        self._open_sub = await nc.subscribe(
            subjects.formatter_open, queue=QUEUE_GROUP, cb=self.on_open
        )
        self._direct_sub = await nc.subscribe(
            subjects.formatter_open_direct(self._config.formatter_id), cb=self.on_open_direct
        )
        await barrier(nc)
        self._spawn(self._sweep_idle(), name="formatter-idle-sweeper")
        self._warmer = ModelWarmer(nc.jetstream(), subjects, self._tokenizers.get)
        await self._warmer.start()
        log.info("formatter_started", formatter_id=self._config.formatter_id)

    async def stop(self) -> None:
        """Stop taking streams, let in-flight ones finish (bounded), fail the rest."""
        self._closing = True
        if self._warmer is not None:
            await self._warmer.stop()
        if self._open_sub is not None:
            await self._open_sub.unsubscribe()
        if self._direct_sub is not None:
            # Preprocessors drop us from their pools; opens already sent are still served.
            leaving = FormatterLeaving(formatter_id=self._config.formatter_id)
            subject = self._subjects.formatter_leaving(self._config.formatter_id)
            await self._nc.publish(subject, codec.encode(leaving))
            await self._nc.flush()
            await asyncio.sleep(LEAVE_GRACE_S)
        if self._states:
            log.info("formatter_draining", in_flight=len(self._states))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), self._config.shutdown_timeout_s)
        if self._direct_sub is not None:
            await self._direct_sub.unsubscribe()
        for request_id in list(self._states):
            await self._fail(request_id, ShuttingDown("the formatter is shutting down"))
        for sub in self._subs:
            await sub.unsubscribe()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        log.info("formatter_stopped", formatter_id=self._config.formatter_id)

    # --- handlers ----------------------------------------------------------------------------

    async def on_open(self, msg: Msg) -> None:
        """StreamOpen (request/reply): create the request's state, answer where to stream."""
        with self.metrics.handling("stream_open"):
            await self._on_open(msg, direct=False)

    async def on_open_direct(self, msg: Msg) -> None:
        """StreamOpen on this instance's subject: no answer; its batches may already be here."""
        with self.metrics.handling("stream_open"):
            await self._on_open(msg, direct=True)

    async def _on_open(self, msg: Msg, *, direct: bool) -> None:
        try:
            request = codec.decode(msg.data, StreamOpen)
        except codec.DecodeError as exc:
            log.warning("stream_open_undecodable", error=str(exc))
            return
        tokenizer = self._tokenizers.peek(request.model)
        # While closing, direct opens still come in until every preprocessor has our notice.
        if tokenizer is not None and (direct or not self._closing):
            await self._open(msg, request, tokenizer, direct=direct)
        else:
            # First request for a model: load without holding up other StreamOpens.
            if direct:
                self._opening.add(request.request_id)
            coro = self._open_loading(msg, request, direct=direct)
            self._spawn(coro, name=f"open-{request.request_id}")

    async def _open_loading(self, msg: Msg, request: StreamOpen, *, direct: bool) -> None:
        try:
            if self._closing:
                raise ShuttingDown("the formatter is shutting down")
            tokenizer = await self._tokenizers.get(request.model)
        except ServiceError as exc:
            self.metrics.error(exc.code)
            log.warning("stream_open_failed", request_id=request.request_id, code=exc.code)
            failed = codec.encode(exc.to_message(request.request_id))
            if direct:  # Generate is already out: tell the gateway, stop the worker
                self._opening.discard(request.request_id)
                self._early.discard(request.request_id)
                self._done.add(request.request_id, self._clock())
                await self._nc.publish(request.reply_to, failed)
                cancel = Cancel(request_id=request.request_id, reason=exc.code)
                await self._nc.publish(self._subjects.cancel, codec.encode(cancel))
            else:
                await msg.respond(failed)
            return
        try:
            await self._open(msg, request, tokenizer, direct=direct)
        finally:
            self._opening.discard(request.request_id)

    async def _open(
        self, msg: Msg, request: StreamOpen, tokenizer: object, *, direct: bool
    ) -> None:
        request_id = request.request_id
        if not direct:
            stream_to = self._subjects.stream(self._config.formatter_id, request_id)
            opened = StreamOpened(
                request_id=request_id, stream_to=stream_to, formatter_id=self._config.formatter_id
            )
            await msg.respond(codec.encode(opened))
        if request_id in self._done:  # cancelled before its open came: the worker drops it too
            self._early.discard(request_id)
            log.debug("stream_open_dropped", request_id=request_id, reason="cancelled")
            return
        state = RequestFormatter(request, tokenizer, now=self._clock())
        # Replay what came early. Until the state is registered, anything arriving meanwhile is
        # held too and picked up by the next round, so the order is kept.
        while held := self._early.take(request_id):
            if not await self._replay(state, held):
                self._early.discard(request_id)
                self._done.add(request_id, self._clock())
                return
        self._states[request_id] = state
        log.debug("stream_opened", request_id=request_id, api=request.api, direct=direct)

    async def _replay(self, state: RequestFormatter, held: list[tuple[WorkerEvent, bytes]]) -> bool:
        """Apply events held for ``state``'s request; False once it has ended."""
        for event, raw in held:
            if not isinstance(event, TokenBatch):
                await self._forward_failure(state, event, raw)
                return False
            if not await self._on_batch(state, event):
                return False
        return True

    async def on_stream(self, msg: Msg) -> None:
        """A worker's TokenBatch or a hop's RequestFailed for one request.

        A missing router or worker never shows up here as NATS "no responders": the server sends
        that status only to the publishing connection, so the forwarding hop catches it on its
        bounce subject and sends a ``RequestFailed`` instead (``shared.bounce``).
        """
        with self.metrics.handling("stream"):
            await self._on_stream(msg)

    async def _on_stream(self, msg: Msg) -> None:
        try:
            # WorkerEvent is a union, not a class: codec.decode's type[T] cannot name it.
            event: WorkerEvent = codec.WORKER_EVENTS.decode(msg.data)
            state = self._states.get(event.request_id)
            if state is None:
                self._hold(event, msg.data)
            elif isinstance(event, TokenBatch):
                await self._on_batch(state, event)
            else:
                await self._forward_failure(state, event, msg.data)
        except Exception:  # boundary: one bad message must not kill the sub
            log.exception("stream_message_failed", subject=msg.subject)

    def _hold(self, event: WorkerEvent, raw: bytes) -> None:
        """An event for a request not opened here (yet): keep it unless the request is over."""
        request_id = event.request_id
        if request_id in self._done:
            log.debug("event_dropped", request_id=request_id, reason="finished")
            return
        evicted = self._early.hold(event, raw, self._clock())
        if evicted is not None:
            log.debug("early_events_dropped", request_id=evicted, reason="too_many")

    async def _on_batch(self, state: RequestFormatter, batch: TokenBatch) -> bool:
        """Format and send one batch; False once the request has ended."""
        if batch.index != state.next_index:
            log.warning(
                "token_batch_gap",
                request_id=batch.request_id,
                expected=state.next_index,
                got=batch.index,
            )
        try:
            data = state.on_batch(batch, self._clock())
        except ServiceError as exc:
            await self._fail(batch.request_id, exc, state=state)
            return False
        finished = state.finish_reason is not None
        if data:
            chunk = ResponseChunk(request_id=batch.request_id, data=data, done=finished)
            await self._nc.publish(state.open.reply_to, codec.encode(chunk))
        if finished:
            self._drop(batch.request_id)
            if state.stopped_by_string:
                cancel = Cancel(request_id=batch.request_id, reason="stop_string")
                await self._nc.publish(self._subjects.cancel, codec.encode(cancel))
            self._log_finished(state)
        return not finished

    async def _forward_failure(
        self, state: RequestFormatter, failed: RequestFailed, raw: bytes
    ) -> None:
        self._drop(failed.request_id)
        self.metrics.error(failed.code)
        await self._nc.publish(state.open.reply_to, raw)
        log.warning("request_failed_upstream", request_id=failed.request_id, code=failed.code)

    async def on_cancel(self, msg: Msg) -> None:
        """Broadcast Cancel: drop the request's state if this instance holds it."""
        with self.metrics.handling("cancel"):
            try:
                cancel = codec.decode(msg.data, Cancel)
            except codec.DecodeError as exc:
                log.warning("cancel_undecodable", error=str(exc))
                return
            if self._drop(cancel.request_id) is not None:
                log.info("request_cancelled", request_id=cancel.request_id, reason=cancel.reason)
            else:  # maybe not opened yet: its open, if it comes, is ignored
                self._done.add(cancel.request_id, self._clock())
                self._early.discard(cancel.request_id)

    # --- helpers -----------------------------------------------------------------------------

    def _drop(self, request_id: str) -> RequestFormatter | None:
        """Forget a request (finished, failed or cancelled)."""
        state = self._states.pop(request_id, None)
        if state is not None:
            self._done.add(request_id, self._clock())
        if self._closing and not self._states:
            self._drained.set()
        return state

    async def _fail(
        self,
        request_id: str,
        exc: ServiceError,
        *,
        cancel: bool = True,
        state: RequestFormatter | None = None,
    ) -> None:
        """Send ``exc`` to the request's gateway and drop its state; ``cancel`` the worker too.

        ``state`` names a request not registered yet (an early event replayed at its open).
        """
        state = self._drop(request_id) or state
        if state is None:
            log.debug("failure_dropped", request_id=request_id, code=exc.code)
            return
        self.metrics.error(exc.code)
        await self._nc.publish(state.open.reply_to, codec.encode(exc.to_message(request_id)))
        if cancel:
            reason = exc.code
            await self._nc.publish(
                self._subjects.cancel, codec.encode(Cancel(request_id=request_id, reason=reason))
            )
        log.warning("request_failed", request_id=request_id, code=exc.code, status=exc.status)

    async def _sweep_idle(self) -> None:
        timeout_s = self._config.idle_timeout_s
        period_s = min(1.0, timeout_s / 4)
        while True:
            await asyncio.sleep(period_s)
            now = self._clock()
            for request_id in self._early.expire(now, keep=self._opening):
                log.debug("early_events_expired", request_id=request_id)
            idle = [rid for rid, s in self._states.items() if now - s.last_seen > timeout_s]
            for request_id in idle:
                error = UpstreamTimeout(f"no tokens for {timeout_s:g} s", retry_after_s=1.0)
                try:
                    await self._fail(request_id, error)
                except Exception:  # the sweeper must outlive a failed publish
                    log.exception("idle_timeout_failed", request_id=request_id)

    def _spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _log_finished(self, state: RequestFormatter) -> None:
        log.info(
            "request_formatted",
            request_id=state.open.request_id,
            api=state.open.api,
            stream=state.open.output.stream,
            completion_tokens=state.completion_tokens,
            finish_reason=state.finish_reason,
            elapsed_ms=round((self._clock() - state.started_at) * 1000, 1),
        )


def build_service(
    config: FormatterConfig, nc: Client, *, metrics: ServiceMetrics | None = None
) -> FormatterService:
    """Compose a formatter on ``nc``: tokenizers come from the model registry's object store."""
    subjects = Subjects(config.namespace)
    files = ModelFiles(nc.jetstream(), subjects)

    async def fetch(model: str) -> bytes | None:
        return await files.get(model, "tokenizer.json")

    return FormatterService(
        config, nc, subjects=subjects, tokenizers=TokenizerCache(fetch), metrics=metrics
    )


async def serve(config: FormatterConfig, *, stop: asyncio.Event | None = None) -> None:
    """Run one formatter until SIGINT/SIGTERM (or ``stop``), then shut down gracefully."""
    nc = await connect(config.nats_url, name=f"formatter-{config.formatter_id}")
    service = build_service(config, nc)
    serve_metrics(service.metrics, config.metrics_port)
    await service.start()
    try:
        await wait_for_signal(stop)
    finally:
        await service.stop()
        await nc.drain()
