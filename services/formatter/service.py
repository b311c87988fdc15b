"""Formatter wiring on raw nats-py: StreamOpen, token batches → ResponseChunk, cancel. I/O only.

Every subscription goes through the shared handler boundary (``shared.handlers``); what to do
with each open, event and cancel is decided by ``streams.Streams`` (pure), what an event means
for its request's attempts (format, drop, migrate, resume, fail) by ``attempts.Attempts``
(pure), the formatting by ``request.py`` / ``detokenizer.py`` / ``shapers/``. ``StreamOpen``
comes either as a queue-group request (answered with ``StreamOpened``) or on this instance's
direct subject, unanswered, in which case its token batches may arrive first (decision 013).

Migration (decision 017, ``migration.py``, ``attempts.py``): when a router says a request's
worker is lost (``WorkerLost``), the worker gave it up while draining, its batches show a hole,
or its worker no longer holds it (decision 018), the request is routed again with what it
generated so far; the client's stream goes on. Chunks are numbered and kept for a replay
(``recovery.py``); they go out with a bounce subject: a gateway that is away gets
``GATEWAY_GRACE_S`` to come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import Counter
from structlog.contextvars import bound_contextvars

from services.formatter.attempts import (
    Answer,
    Attempts,
    FailLost,
    Forward,
    Gap,
    Migrate,
    Outcome,
    Repeated,
    Resume,
)
from services.formatter.config import FormatterConfig
from services.formatter.migration import NotMigrated
from services.formatter.recovery import GATEWAY_GRACE_S, STALL_CHECK_S, Recovery
from services.formatter.request import RequestFormatter
from services.formatter.streams import Dropped, Held, Ignore, Streams
from services.formatter.tokenizer_cache import TokenizerCache
from shared import codec
from shared.bounce import Unreachable
from shared.bus import barrier, drain_subscription
from shared.errors import (
    ServiceError,
    ServiceUnavailable,
    ShuttingDown,
    UpstreamTimeout,
    WorkerLost,
)
from shared.handlers import Boundary
from shared.messages import (
    Cancel,
    FormatterLeaving,
    Message,
    Migrated,
    RequestFailed,
    ResponseChunk,
    StreamOpen,
    StreamOpened,
    TokenBatch,
    WorkerEvent,
)
from shared.messages import WorkerLost as WorkerLostNotice
from shared.metrics import ServiceMetrics
from shared.registry import ModelFiles
from shared.subjects import Subjects
from shared.tasks import TaskSet
from shared.warmup import ModelWarmer

log = structlog.get_logger(__name__)

QUEUE_GROUP = "formatter"
LEAVE_GRACE_S = 0.05
"""On shutdown, after telling preprocessors to stop direct opens, how long to keep taking the
ones already on their way before draining."""
UNROUTED_CHECK_S = 2.0
"""A migratable request with no token this long: ask the routers whether it was routed."""
WARM_BEFORE_SERVING_S = 30.0
"""At start, the longest wait for the served models' tokenizers before taking streams."""
STREAM_OPEN = codec.decoder(StreamOpen)
CANCEL = codec.decoder(Cancel)
WORKER_LOST = codec.decoder(WorkerLostNotice)


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
        self._nc = nc
        self._subjects = subjects
        self._tokenizers = tokenizers
        self._clock = clock
        self._streams: Streams[RequestFormatter] = Streams(idle_timeout_s=config.idle_timeout_s)
        self._attempts = Attempts(partial(subjects.stream, config.formatter_id))
        self.metrics.track_in_flight(lambda: self._streams.in_flight)
        self._tasks = TaskSet()
        self._subs: list[Subscription] = []
        self._open_sub: Subscription | None = None
        self._direct_sub: Subscription | None = None
        self._warmer: ModelWarmer | None = None
        self._closing = False
        self._drained = asyncio.Event()
        """Set, while closing, once the last in-flight request is gone."""
        self.migrations = Counter(
            "jetserve_formatter_migrations_total",
            "Requests routed again after their worker was lost (decision 017): new_request = "
            "before any token, ongoing = mid-stream",
            ["kind"],
            registry=self.metrics.registry,
        )
        self._unreachable = Unreachable(
            nc, subjects, self._on_bounce, instance_id=f"{config.formatter_id}-f"
        )
        self._is_debug = log.is_enabled_for(logging.DEBUG)
        boundary = self._boundary = Boundary(nc, self.metrics)
        self._recovery = Recovery(
            nc,
            subjects,
            self._streams,
            boundary=boundary,
            unreachable=self._unreachable,
            migrate=self._try_migrate,
            move=self._move,
            tasks=self._tasks,
            clock=clock,
        )
        self._on_stream_msg = boundary.handler(
            codec.WORKER_EVENTS,
            "stream",
            self.on_stream,
            reply_to=self._reply_subject,
            after_failure=self._abandon,
        )
        self._on_cancel_msg = boundary.handler(CANCEL, "cancel", self.on_cancel)
        self._on_lost_msg = boundary.handler(WORKER_LOST, "worker_lost", self.on_worker_lost)
        self._on_open_direct_msg = boundary.handler(
            STREAM_OPEN,
            "stream_open",
            self.on_open_direct,
            reply_to=_gateway,
            after_failure=self._abandon,
        )
        self._open_after_load = boundary.wrap(
            "stream_open_loading",
            self._load_and_open,
            reply_to=_gateway,
            after_failure=self._abandon,
        )

    @property
    def service_metrics(self) -> ServiceMetrics:
        return self.metrics

    @property
    def in_flight(self) -> int:
        """Requests opened and not yet finished."""
        return self._streams.in_flight

    async def start(self) -> None:
        """Subscribe (stream and cancel first, so no batch for an opened stream is missed)."""
        nc, subjects, formatter_id = self._nc, self._subjects, self._config.formatter_id
        self._subs.append(
            await nc.subscribe(subjects.stream_all(formatter_id), cb=self._on_stream_msg)
        )
        self._subs.append(await nc.subscribe(subjects.cancel, cb=self._on_cancel_msg))
        # Workers whose batches bounced ask whether we are there (decision 018): until the end.
        ping = subjects.formatter_ping(formatter_id)
        self._subs.append(await nc.subscribe(ping, cb=_pong))
        self._subs.append(await nc.subscribe(subjects.worker_lost, cb=self._on_lost_msg))
        await self._unreachable.start()
        await self._recovery.start()
        # A restart while workers serve: load their tokenizers before taking streams.
        self._warmer = ModelWarmer(nc.jetstream(), subjects, self._tokenizers.get)
        await self._warmer.start()
        await self._warmer.ready(WARM_BEFORE_SERVING_S)
        self._open_sub = await nc.subscribe(
            subjects.formatter_open, queue=QUEUE_GROUP, cb=self._on_open_msg
        )
        self._direct_sub = await nc.subscribe(
            subjects.formatter_open_direct(formatter_id), cb=self._on_open_direct_msg
        )
        await barrier(nc)
        self._tasks.spawn(self._sweep(), name="formatter-sweeper")
        log.info("formatter_started", formatter_id=formatter_id)

    async def stop(self) -> None:
        """Stop taking streams, let in-flight ones finish (bounded), fail the rest."""
        self._closing = True
        if self._warmer is not None:
            await self._warmer.stop()
        if self._open_sub is not None:  # drain: handshakes already delivered are answered
            await drain_subscription(self._open_sub)
        if self._direct_sub is not None:
            # Preprocessors drop us from their pools; opens already sent are still served.
            leaving = FormatterLeaving(formatter_id=self._config.formatter_id)
            subject = self._subjects.formatter_leaving(self._config.formatter_id)
            await self._nc.publish(subject, codec.encode(leaving))
            await self._nc.flush()
            await asyncio.sleep(LEAVE_GRACE_S)
        if self._streams.in_flight:
            log.info("formatter_draining", in_flight=self._streams.in_flight)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), self._config.shutdown_grace_s)
        if self._direct_sub is not None:
            await self._direct_sub.unsubscribe()
        for _, state in self._streams.open_requests():
            await self._fail(state, ShuttingDown("the formatter is shutting down"))
        for sub in self._subs:
            await sub.unsubscribe()
        await self._recovery.stop()
        await self._unreachable.stop()
        await self._tasks.close()

    async def on_bus_back(self) -> None:
        """Our NATS connection is back (``shared.lifecycle``): check every routed request now."""
        await self._recovery.on_bus_back()

    # --- handlers (decoded, request id bound, counted, failures answered by the Boundary) ----

    async def _on_open_msg(self, msg: Msg) -> None:
        """The queue group's callback: a Boundary handler of its own for each handshake.

        The answer goes to ``msg.reply``, which the Boundary does not hand to ``fn``; handshakes
        are rare (discovery, or ``--no-direct-open``), so building one per message costs little.
        """
        reply = msg.reply

        async def open_answering(request: StreamOpen) -> None:
            await self.on_open(request, reply)

        handle = self._boundary.handler(
            STREAM_OPEN, "stream_open", open_answering, reply_to=lambda _: reply, tasks=self._tasks
        )
        await handle(msg)

    async def on_open(self, request: StreamOpen, reply: str) -> None:
        """StreamOpen on the queue group: answer where to stream (``StreamOpened``), then open."""
        if self._closing:
            raise ShuttingDown("the formatter is shutting down")
        tokenizer = await self._tokenizers.get(request.base_model or request.model)
        formatter_id, request_id = self._config.formatter_id, request.request_id
        stream_to = self._subjects.stream(formatter_id, request_id)
        opened = StreamOpened(request_id=request_id, stream_to=stream_to, formatter_id=formatter_id)
        await self._nc.publish(reply, codec.encode(opened))
        await self._open(request, tokenizer, direct=False)

    async def on_open_direct(self, request: StreamOpen) -> None:
        """StreamOpen on this instance's subject: no answer; its batches may already be here.

        A failure goes to the gateway, with a ``Cancel`` for the worker (``Generate`` is out).
        """
        tokenizer = self._tokenizers.peek(request.base_model or request.model)
        if tokenizer is not None:
            await self._open(request, tokenizer, direct=True)
            return
        # First request for a model: load in a task of its own, so opens for loaded models go
        # on meanwhile; its early events wait for the load. While closing, direct opens still
        # come until every preprocessor has our notice.
        if self._closing:
            raise ShuttingDown("the formatter is shutting down")
        self._streams.loading(request.request_id, self._clock())
        self._tasks.spawn(self._open_after_load(request), name=f"open-{request.request_id}")

    async def _load_and_open(self, request: StreamOpen) -> None:
        tokenizer = await self._tokenizers.get(request.base_model or request.model)
        await self._open(request, tokenizer, direct=True)

    async def on_stream(self, event: WorkerEvent) -> None:
        """A worker's TokenBatch or a hop's RequestFailed for one request (the per-token path).

        A missing router or worker never shows up here as NATS "no responders": the server sends
        that status only to the publishing connection, so the forwarding hop catches it on its
        bounce subject and sends a ``RequestFailed`` instead (``shared.bounce``).
        """
        now = self._clock()
        found = self._streams.on_event(event, now)
        if isinstance(found, RequestFormatter):
            await self._deliver(found, event, now)
        elif self._is_debug:
            _log_not_delivered(found)

    async def on_cancel(self, cancel: Cancel) -> None:
        """Broadcast Cancel: forget the request; an open that comes after it is ignored.

        A cancel of one worker's attempt (``worker_id`` set) is ours, sent when migrating.
        """
        if cancel.worker_id is not None:
            return
        if self._end(cancel.request_id) is not None and self._is_debug:
            log.debug("request_cancelled", reason=cancel.reason)

    async def on_worker_lost(self, lost: WorkerLostNotice) -> None:
        """A router found a worker lost: migrate each of its requests that is ours."""
        for request_id in lost.request_ids:
            state = self._streams.get(request_id)
            if state is None:
                continue
            with bound_contextvars(request_id=request_id):
                now = self._clock()
                await self._act(state, self._attempts.on_worker_lost(state, lost, now), now)

    # --- migration -----------------------------------------------------------------------------

    async def _move(self, state: RequestFormatter, from_worker: str, reason: str) -> None:
        """Migrate the request, or fail it with ``worker_lost`` when it may not move."""
        now = self._clock()
        await self._act(state, self._attempts.move(state, from_worker, reason, now), now)

    async def _try_migrate(
        self, state: RequestFormatter, from_worker: str, reason: str
    ) -> NotMigrated | None:
        """Migrate the request if it may move; otherwise say why, and leave it as it is."""
        moved = self._attempts.migrate(state, from_worker, reason, self._clock())
        if isinstance(moved, NotMigrated):
            return moved
        await self._migrate(state, moved)
        return None

    async def _migrate(self, state: RequestFormatter, moved: Migrate) -> None:
        """Route the request's next attempt; one log line, one bus message."""
        request_id = state.open.request_id
        from_worker = moved.from_worker
        nc, subjects = self._nc, self._subjects
        if from_worker:  # stop that attempt if the worker is only hung; routers free its slot
            stale = Cancel(request_id=request_id, reason="migrated", worker_id=from_worker)
            await nc.publish(subjects.cancel, codec.encode(stale))
        reply = self._unreachable.reply_for(request_id)
        await nc.publish(subjects.route, codec.encode(moved.attempt), reply=reply)
        notice = Migrated(
            request_id=request_id,
            kind=moved.kind,
            from_worker=from_worker,
            reason=moved.reason,
            attempt=moved.attempt.attempt,
            generated_tokens=moved.attempt.resumed_tokens,
            formatter_id=self._config.formatter_id,
        )
        await nc.publish(subjects.migrations, codec.encode(notice))
        self.migrations.labels(moved.kind).inc()
        fields = msgspec.structs.asdict(notice)  # the log line says what the bus message says
        del fields["request_id"], fields["formatter_id"]  # bound to every line already
        log.info("request_migrated", **fields)

    async def _on_bounce(self, request_id: str, subject: str) -> None:
        """Nobody took a migrated ``Generate`` (no router), or a chunk (the gateway is away:
        it has ``GATEWAY_GRACE_S`` to ask for a replay; an ended request keeps its history)."""
        state = self._streams.get(request_id)
        if state is None:
            return
        with bound_contextvars(request_id=request_id):
            if subject == self._subjects.route:
                await self._fail(state, ServiceUnavailable("no router is running"))
            elif state.gateway_away_since is None:
                state.gateway_away_since = self._clock()
                log.info("gateway_away", subject=subject)

    async def _gateway_gone(self, state: RequestFormatter, now: float) -> None:
        """Its gateway stayed away the whole grace: end the request, stop its worker."""
        request_id = state.open.request_id
        away_s = now - (state.gateway_away_since or now)
        with bound_contextvars(request_id=request_id):
            log.warning("gateway_gone", away_s=round(away_s, 2))
        self._end(request_id)
        await self._cancel_worker(request_id, "gateway_gone")

    # --- helpers -----------------------------------------------------------------------------

    async def _open(self, request: StreamOpen, tokenizer: Any, *, direct: bool) -> None:
        """Create the request's state and replay what came before it, in order."""
        request_id = request.request_id
        now = self._clock()
        state = RequestFormatter(request, tokenizer, now=now)
        decision = self._streams.on_open(request_id, state)
        if isinstance(decision, Ignore):
            log.debug("stream_open_dropped", reason=decision.reason)
            return
        events = decision.events
        while events:
            for event in events:
                if not await self._deliver(state, event, self._clock()):
                    return
            events = self._streams.replayed(request_id)
        if self._is_debug:
            log.debug("stream_opened", api=request.api, direct=direct)

    async def _deliver(self, state: RequestFormatter, event: WorkerEvent, now: float) -> bool:
        """Apply one event to its request (``attempts`` decides how); False once it ended."""
        decided = self._attempts.on_event(state, event, now)
        if isinstance(decided, TokenBatch):  # the per-token path
            return await self._format(state, decided, now)
        return await self._act(state, decided, now)

    async def _act(
        self, state: RequestFormatter, decided: TokenBatch | Outcome, now: float
    ) -> bool:
        """Do what the attempt rules decided; False once the request ended."""
        if isinstance(decided, TokenBatch):
            return await self._format(state, decided, now)
        if isinstance(decided, Migrate):
            await self._migrate(state, decided)
            return self._streams.get(state.open.request_id) is state
        if isinstance(decided, Gap):
            log.warning("token_batch_gap", expected=decided.expected, got=decided.got)
            return await self._act(state, decided.then, now)
        if isinstance(decided, FailLost):
            log.warning("request_not_migrated", worker_id=decided.from_worker, why=decided.why)
            await self._fail(state, WorkerLost(decided.message))
            return False
        if isinstance(decided, Forward):
            await self._forward_failure(state, decided.failed)
            return False
        if isinstance(decided, Resume):
            return await self._resume(state, decided, now)
        if isinstance(decided, Answer):
            return await self._answer(state, decided, now)
        if isinstance(decided, Repeated):
            log.debug("token_batch_repeated", expected=decided.expected, got=decided.got)
        return True  # stale: about an attempt or a worker the request has left

    async def _resume(self, state: RequestFormatter, resume: Resume, now: float) -> bool:
        """Deliver the tokens the worker gave the request up with, then move on from them."""
        if resume.kept is not None and not await self._deliver(state, resume.kept, now):
            return False
        return await self._act(state, self._attempts.after_resume(state, resume.batch, now), now)

    async def _answer(self, state: RequestFormatter, answer: Answer, now: float) -> bool:
        """Deliver a query-only request's answer: the batches that end its choices."""
        for batch in answer.batches:
            if not await self._deliver(state, batch, now):
                return False
        return True

    async def _format(self, state: RequestFormatter, batch: TokenBatch, now: float) -> bool:
        """Format the next batch and send what it gives; False once the request ended."""
        try:
            data = state.on_batch(batch, now)
        except ServiceError as exc:
            await self._fail(state, exc)
            return False
        if state.finish_reason is not None:
            await self._finish(state, data)
            return False
        if data:
            chunk = ResponseChunk(
                request_id=batch.request_id, data=data, seq=state.history.next_seq
            )
            encoded = codec.encode(chunk)
            state.history.add(encoded)  # the bytes sent are the bytes kept: no copy
            reply = self._unreachable.reply_for(batch.request_id)
            await self._nc.publish(state.open.reply_to, encoded, reply=reply)
        return True

    async def _finish(self, state: RequestFormatter, data: bytes) -> None:
        """Send the last chunk, with the token counts (the gateway's access line, gRPC's
        response) and the finish reason (the one place a ``text`` response carries it)."""
        request_id = state.open.request_id
        self._end(request_id)
        chunk = ResponseChunk(
            request_id=request_id,
            data=data,
            done=True,
            prompt_tokens=state.open.prompt_tokens,
            completion_tokens=state.completion_tokens,
            finish_reason=state.finish_reason,
            seq=state.history.next_seq,
        )
        encoded = codec.encode(chunk)
        state.history.add(encoded)
        self._recovery.keep(state)  # before publishing: a resume may come at once
        await self._nc.publish(state.open.reply_to, encoded)
        if state.stopped_by_string:
            await self._cancel_worker(request_id, "stop_string")
        if self._is_debug:
            log.debug(
                "request_formatted",
                api=state.open.api,
                stream=state.open.output.stream,
                prompt_tokens=state.open.prompt_tokens,
                completion_tokens=state.completion_tokens,
                finish_reason=state.finish_reason,
                elapsed_ms=round((self._clock() - state.started_at) * 1000, 1),
            )

    async def _forward_failure(self, state: RequestFormatter, failed: RequestFailed) -> None:
        self._end(failed.request_id)
        self.metrics.error(failed.code)
        encoded = codec.encode(failed)
        self._recovery.keep(state, tail=encoded)
        await self._nc.publish(state.open.reply_to, encoded)
        log.warning("request_failed_upstream", code=failed.code, status=failed.status)

    async def _fail(self, state: RequestFormatter, exc: ServiceError) -> None:
        """End the request, send ``exc`` to its gateway and stop its worker."""
        request_id = state.open.request_id
        self._end(request_id)
        self._recovery.keep(state, tail=codec.encode(exc.to_message(request_id)))
        with bound_contextvars(request_id=request_id):
            await self._boundary.fail(state.open.reply_to, request_id, exc)
        await self._cancel_worker(request_id, exc.code)

    async def _abandon(self, message: Message, exc: ServiceError) -> None:
        """After the Boundary answered a failed open or event: forget it, stop its worker."""
        self._end(message.request_id)
        await self._cancel_worker(message.request_id, exc.code)

    def _reply_subject(self, event: WorkerEvent) -> str | None:
        """Where a failure of ``event``'s request goes: its gateway, once it is known."""
        state = self._streams.get(event.request_id)
        return state.open.reply_to if state is not None else None

    def _end(self, request_id: str) -> RequestFormatter | None:
        state = self._streams.end(request_id, self._clock())
        if self._closing and not self._streams.in_flight:
            self._drained.set()
        return state

    async def _cancel_worker(self, request_id: str, reason: str) -> None:
        cancel = Cancel(request_id=request_id, reason=reason)
        await self._nc.publish(self._subjects.cancel, codec.encode(cancel))

    async def _sweep(self) -> None:
        """Fail requests idle too long (504, and cancel); drop early events held too long."""
        timeout_s = self._config.idle_timeout_s
        period_s = min(1.0, timeout_s / 4)
        while True:
            await asyncio.sleep(period_s)
            try:
                await self._check_requests(self._clock())
            except Exception:  # the sweeper must outlive a failed publish
                log.exception("request_crashed", kind="sweep")
            expired = self._streams.expire(self._clock())
            for request_id in expired.early:
                log.debug("early_events_expired", request_id=request_id)
            for _, state in expired.idle:
                error = UpstreamTimeout(f"no tokens for {timeout_s:g} s", retry_after_s=1.0)
                try:
                    await self._fail(state, error)
                except Exception:  # the sweeper must outlive a failed publish
                    log.exception("request_crashed", kind="idle_timeout")

    async def _check_requests(self, now: float) -> None:
        """End requests whose gateway is gone; ask about unrouted and stalled ones."""
        recovery = self._recovery
        for _, state in self._streams.open_requests():
            if state.gateway_gone(now, GATEWAY_GRACE_S):
                await self._gateway_gone(state, now)
            elif state.awaits_routing_check(now, UNROUTED_CHECK_S):
                recovery.check_routed(state)
            elif state.awaits_stall_check(now, STALL_CHECK_S):
                recovery.ping(state)
        recovery.finished.prune(now)


async def _pong(msg: Msg) -> None:
    """A worker's question "are you there?": answering at all is the answer."""
    with contextlib.suppress(Exception):
        await msg.respond(b"")


def _gateway(request: StreamOpen) -> str:
    return request.reply_to


def _log_not_delivered(outcome: Held | Dropped) -> None:
    if isinstance(outcome, Dropped):
        log.debug("event_dropped", reason=outcome.reason)
    elif outcome.evicted is not None:
        log.debug("early_events_dropped", evicted=outcome.evicted, reason="too_many_requests")
    else:
        log.debug("event_held")


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
