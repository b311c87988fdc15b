"""Feed the KV index from JetStream: an ordered consumer on the whole stream, plus dumps.

Every replica reads every worker's ``KvEventBatch`` from ``<NS>_KV_EVENTS`` with its own
ephemeral ordered consumer, starting after the sequence its snapshot covers. A per-worker
``event_id`` gap (``KvSync`` says ``GAP``) becomes a ``KvDumpRequest`` to that worker; the reply
replaces the worker's blocks. No reply: the held batches are applied anyway (best effort).

A restarted nats-server keeps the stream (file storage) but forgets the ephemeral consumer, and
nats-py would notice only after two missed idle heartbeats (10 s): a guard asks the server for
the consumer every ``CONSUMER_CHECK_S`` and, when it is gone, consumes again from the sequence
after the last one applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from services.router.metrics import RouterMetrics
from services.router.sync import KvSync, Outcome
from shared import codec
from shared.bus import consumer_alive
from shared.kv_stream import ensure_kv_stream
from shared.messages import KvDump, KvDumpRequest, KvEventBatch
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

MAX_DUMP_ATTEMPTS = 3
CONSUMER_CHECK_S = 1.0
"""How often the feed asks the server whether its consumer still exists."""
CONSUMER_CHECK_TIMEOUT_S = 1.0


class KvFeed:
    """Consumes the KV event stream into a ``KvSync`` and repairs gaps with dumps."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        sync: KvSync,
        metrics: RouterMetrics,
        *,
        router_id: str,
        dump_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self._subjects = subjects
        self.sync = sync
        self._metrics = metrics
        self._router_id = router_id
        self._dump_timeout_s = dump_timeout_s
        self._clock = clock
        self._sub: JetStreamContext.PushSubscription | None = None
        self._target_seq = 0
        self._caught_up = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._attempts: dict[str, int] = {}
        self._limits: tuple[float, int] = (0.0, 0)
        self._guard: asyncio.Task[None] | None = None

    async def start(self, *, max_age_s: float, max_bytes: int) -> None:
        """Ensure the stream, then consume it from the sequence after the index's."""
        self._limits = (max_age_s, max_bytes)
        info = await ensure_kv_stream(
            self._js, self._subjects, max_age_s=max_age_s, max_bytes=max_bytes
        )
        self._target_seq = info.state.last_seq
        start = self.sync.stream_seq + 1
        if self._target_seq < start:
            self._caught_up.set()
        await self._subscribe(start)
        self._guard = asyncio.create_task(self._keep_consuming(), name="kv-feed-guard")
        log.info("kv_feed_started", start_seq=start, stream_last_seq=self._target_seq)

    async def _subscribe(self, start: int) -> None:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
        self._sub = await self._js.subscribe(
            self._subjects.kv_events_all,
            stream=self._subjects.kv_stream,
            cb=self._on_msg,
            ordered_consumer=True,
            config=config,
        )

    async def _keep_consuming(self) -> None:
        """Forever: when the server lost the consumer, consume again after the last sequence."""
        while True:
            await asyncio.sleep(CONSUMER_CHECK_S)
            sub = self._sub  # None: the last attempt to consume again failed
            if sub is not None and await consumer_alive(sub, CONSUMER_CHECK_TIMEOUT_S) is not False:
                continue
            try:
                await self._resubscribe()
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("kv_feed_resubscribe_failed", error=repr(exc))

    async def _resubscribe(self) -> None:
        old, self._sub = self._sub, None
        if old is not None:  # what it still holds unread is delivered again by the new one
            with contextlib.suppress(Exception):
                await old.unsubscribe()
        try:
            last_seq = (await self._js.stream_info(self._subjects.kv_stream)).state.last_seq
        except NotFoundError:  # a server that lost its store: the stream starts over
            max_age_s, max_bytes = self._limits
            info = await ensure_kv_stream(
                self._js, self._subjects, max_age_s=max_age_s, max_bytes=max_bytes
            )
            last_seq = info.state.last_seq
        if last_seq < self.sync.stream_seq:
            # A server that lost its store numbers a new stream from 1: consume it from there.
            # Workers' event ids go on, so the next batch of each is a gap and brings a dump.
            log.warning("kv_stream_restarted", at_seq=self.sync.stream_seq, last_seq=last_seq)
            self.sync.stream_seq = last_seq
        start = self.sync.stream_seq + 1
        await self._subscribe(start)
        log.info("kv_feed_resubscribed", start_seq=start, stream_last_seq=last_seq)

    async def wait_caught_up(self, timeout_s: float) -> bool:
        """True once the stream as it was at ``start`` has been consumed (False on timeout)."""
        try:
            await asyncio.wait_for(self._caught_up.wait(), timeout_s)
        except TimeoutError:
            log.warning("kv_feed_catchup_timeout", at_seq=self.sync.stream_seq)
            return False
        return True

    async def stop(self) -> None:
        if self._guard is not None:
            self._guard.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._guard
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _on_msg(self, msg: Msg) -> None:
        meta = msg.metadata
        seq = meta.sequence.stream
        try:
            batch = codec.decode(msg.data, KvEventBatch)
        except codec.DecodeError as exc:
            self._metrics.base.error("message_undecodable")
            log.warning(
                "message_undecodable",
                subject=msg.subject,
                kind="kv_event_batch",
                seq=seq,
                error=str(exc),
            )
            self.sync.stream_seq = max(self.sync.stream_seq, seq)
            return
        outcome = self.sync.on_batch(batch, seq)
        self._count([outcome], batch.worker_id)
        self._metrics.event_lag.set(meta.num_pending)
        if batch.ts:
            self._metrics.event_age.set(max(0.0, self._clock() - batch.ts))
        if seq >= self._target_seq:
            self._caught_up.set()

    def _count(self, outcomes: Iterable[Outcome], worker_id: str) -> None:
        for outcome in outcomes:
            self._metrics.kv_events.labels(outcome.value).inc()
            if outcome is Outcome.GAP:
                self.request_dump(worker_id)
            elif outcome is Outcome.APPLIED:
                self._attempts.pop(worker_id, None)

    def request_dump(self, worker_id: str) -> None:
        """Ask the worker for all it caches (a gap in its events, or it came back)."""
        attempts = self._attempts.get(worker_id, 0) + 1
        self._attempts[worker_id] = attempts
        log.warning("kv_event_gap", worker_id=worker_id, attempt=attempts)
        task = asyncio.create_task(self._dump(worker_id, attempts), name=f"kv-dump-{worker_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dump(self, worker_id: str, attempt: int) -> None:
        request = codec.encode(KvDumpRequest(router_id=self._router_id))
        try:
            if attempt > MAX_DUMP_ATTEMPTS:
                raise TimeoutError("too many dump attempts")
            reply = await self._nc.request(
                self._subjects.kv_dump(worker_id), request, timeout=self._dump_timeout_s
            )
            dump = codec.decode(reply.data, KvDump)
        except (nats.errors.Error, TimeoutError, codec.DecodeError) as exc:
            log.warning("kv_dump_failed", worker_id=worker_id, error=repr(exc))
            self._metrics.dumps.labels("failed").inc()
            self._attempts.pop(worker_id, None)
            self._count(list(self.sync.abandon_dump(worker_id)), worker_id)
            return
        if worker_id not in self.sync.held:  # the worker left meanwhile
            return
        self._metrics.dumps.labels("applied").inc()
        log.info(
            "kv_dump_applied", worker_id=worker_id, event_id=dump.event_id, events=len(dump.events)
        )
        self._count(list(self.sync.apply_dump(dump)), worker_id)

    @property
    def target_seq(self) -> int:
        return self._target_seq
