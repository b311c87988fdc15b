"""What a worker tells the routers: KV events (JetStream), load, lifecycle, and KV dumps.

KV events leave the engine loop as a list append; a background task numbers them
(``KvEventLog``) and stores one batch at a time with ``js.publish``, so the engine never waits
for a JetStream ack and everything produced during a short linger plus one round trip goes out
as the next batch.
Each batch carries ``Nats-Msg-Id`` = worker, incarnation and event id, so a retry is stored once.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Literal

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import NoStreamResponseError

from shared import codec
from shared.kv_stream import ensure_kv_stream
from shared.messages import KvDump, KvDumpRequest, RequestPhase, WorkerLoad
from shared.subjects import Subjects
from shared.worker.engine import WorkerEngine
from shared.worker.kv_events import KvEventLog, LoadReporter
from shared.worker.metrics import WorkerMetrics

log = structlog.get_logger(__name__)

PUBLISH_TIMEOUT_S = 2.0
MAX_RETRY_DELAY_S = 1.0
KV_BATCH_LINGER_S = 0.005
"""Wait this long after the first new event before sealing a batch: one JetStream publish and
ack costs ~120 µs of CPU, so at speedup 0 a worker stores at most ~200 batches/s, not one per
step. Routers see a new block at most this much later (plus the ack round trip). A worker that
goes idle stores at once (``idle``): nothing more is coming to gather, and a one-at-a-time
client's next request would otherwise meet the store and its ack halfway through its first
token's path."""
LOAD_INTERVAL_S = 0.05
"""Load goes out on change at most this often (and at once when the worker goes idle)."""
LOAD_HEARTBEAT_S = 1.0
"""And unchanged this often: routers settle the requests they count on this worker with it
(``services/router/load.py``), and a worker that stops reporting goes stale there."""


class WorkerPublisher:
    """KV event batches, ``WorkerLoad``, ``RequestPhase`` and ``KvDump`` replies of one worker."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        worker_id: str,
        engine: WorkerEngine,
        metrics: WorkerMetrics,
        *,
        kv_stream_limits: tuple[float, int] | None = None,
        replicas: int = 1,
    ) -> None:
        self.worker_id = worker_id
        self.events = KvEventLog(worker_id)
        self._nc = nc
        self._js = nc.jetstream()
        self._subjects = subjects
        self._engine = engine
        self._metrics = metrics
        self._kv_stream_limits = kv_stream_limits
        self._replicas = replicas
        self._load = LoadReporter(LOAD_INTERVAL_S, LOAD_HEARTBEAT_S)
        self._incarnation = secrets.token_hex(4)
        self._wake = asyncio.Event()
        self._now = asyncio.Event()
        """Store without lingering (the worker went idle)."""
        self._is_closing = False
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Answer dumps and start the KV event sender (the engine's start reset goes first)."""
        self._sub = await self._nc.subscribe(
            self._subjects.kv_dump(self.worker_id), cb=self.on_kv_dump
        )
        self._task = asyncio.create_task(self._send_loop(), name=f"kv-events-{self.worker_id}")
        self.collect_kv_events()
        await self.report_load(is_idle=True)
        self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name="load-heartbeat")

    async def stop(self, timeout_s: float = 2.0) -> None:
        """Send what is left (bounded), then stop answering dumps."""
        self._is_closing = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        self._wake.set()
        self._now.set()  # cut a linger short
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if len(self.events):
            log.warning("kv_events_unsent", worker_id=self.worker_id, count=len(self.events))
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    # --- engine loop side (cheap, never waits for JetStream) -------------------------------------

    def collect_kv_events(self) -> None:
        """Take the engine's new KV events; the sender task stores them."""
        events = self._engine.take_kv_events()
        if events:
            self.events.add(events)
            self._wake.set()

    def idle(self) -> None:
        """The engine has no work: store the events gathered so far without lingering."""
        if len(self.events):
            self._now.set()

    async def phase(
        self,
        request_id: str,
        phase: Literal["prefill_done", "finished"],
        dp_rank: int = 0,
        *,
        output_tokens: int = 0,
    ) -> None:
        """Publish ``RequestPhase`` (core NATS) so routers move the request's load (of the
        data-parallel rank ``dp_rank``) and charge its output tokens."""
        message = RequestPhase(
            request_id=request_id,
            worker_id=self.worker_id,
            phase=phase,
            ts=time.time(),
            dp_rank=dp_rank,
            output_tokens=output_tokens,
        )
        await self._nc.publish(self._subjects.lifecycle(self.worker_id), codec.encode(message))

    async def _heartbeat_loop(self) -> None:
        """Report the load unchanged every ``LOAD_HEARTBEAT_S`` (``report_load`` skips the
        beat when a change went out meanwhile)."""
        while True:
            await asyncio.sleep(LOAD_HEARTBEAT_S)
            try:
                await self.report_load()
            except nats.errors.Error as exc:  # closed under us: the next beat tries again
                log.debug("load_heartbeat_failed", error=repr(exc))

    async def report_load(self, *, is_idle: bool = False) -> None:
        """Publish ``WorkerLoad`` if it changed (at most every ``LOAD_INTERVAL_S``) or none
        went out for ``LOAD_HEARTBEAT_S``."""
        now = time.monotonic()
        if not self._load.may_report(now, is_idle=is_idle):
            return
        load = self._engine.load()
        snapshot = (load.active, load.waiting, load.kv_used_blocks, load.prefill_tokens)
        if not self._load.due(snapshot, now, is_idle=is_idle):
            return
        self._metrics.observe(self.worker_id, load, self._engine.stats)
        message = WorkerLoad(
            worker_id=self.worker_id,
            active=load.active,
            waiting=load.waiting,
            kv_used_blocks=load.kv_used_blocks,
            kv_total_blocks=load.kv_total_blocks,
            prefill_tokens=load.prefill_tokens,
            ts=time.time(),
        )
        await self._nc.publish(self._subjects.load(self.worker_id), codec.encode(message))

    # --- handlers --------------------------------------------------------------------------------

    async def on_kv_dump(self, msg: Msg) -> None:
        """Reply with every cached block, as of the newest event id (pending events sealed)."""
        if msg.data:
            try:
                request = codec.decode(msg.data, KvDumpRequest)
            except codec.DecodeError as exc:
                self._metrics.service.error("message_undecodable")
                log.warning(
                    "message_undecodable",
                    subject=msg.subject,
                    kind="kv_dump_request",
                    error=str(exc),
                )
                return
            log.info("kv_dump_requested", worker_id=self.worker_id, router_id=request.router_id)
        event_id = self.events.seal(time.time())
        self._wake.set()
        data = b""
        for with_tokens in (True, False):  # token ids are informative; hashes must fit
            dump = KvDump(
                worker_id=self.worker_id,
                event_id=event_id,
                events=tuple(self._engine.kv_dump(with_tokens=with_tokens)),
            )
            data = codec.encode(dump)
            if len(data) <= self._nc.max_payload:
                await msg.respond(data)
                return
        log.error("kv_dump_too_large", worker_id=self.worker_id, bytes=len(data))

    # --- sender ----------------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        subject = self._subjects.kv_events(self.worker_id)
        delay_s = 0.05
        while not (self._is_closing and not len(self.events)):
            await self._wake.wait()
            if not self._is_closing and not self._now.is_set():
                with contextlib.suppress(TimeoutError):  # gather a few steps into one batch
                    await asyncio.wait_for(self._now.wait(), KV_BATCH_LINGER_S)
            self._wake.clear()
            self._now.clear()
            self.events.seal(time.time())  # events arriving while this is stored wait a linger
            while (batch := self.events.oldest()) is not None:
                headers = {"Nats-Msg-Id": f"{self.worker_id}:{self._incarnation}:{batch.event_id}"}
                try:
                    await self._js.publish(
                        subject, codec.encode(batch), timeout=PUBLISH_TIMEOUT_S, headers=headers
                    )
                except (
                    nats.errors.Error,
                    TimeoutError,
                    OSError,
                ) as exc:  # keep order, retry this one
                    log.warning(
                        "kv_events_publish_failed", event_id=batch.event_id, error=repr(exc)
                    )
                    if isinstance(exc, NoStreamResponseError):
                        with contextlib.suppress(Exception):
                            await self._ensure_stream()
                    await asyncio.sleep(delay_s)
                    delay_s = min(MAX_RETRY_DELAY_S, delay_s * 2)
                    continue
                delay_s = 0.05
                self.events.pop()
                self._metrics.kv_event_batches.labels(self.worker_id).inc()

    async def _ensure_stream(self) -> None:
        if self._kv_stream_limits is None:
            await ensure_kv_stream(self._js, self._subjects, replicas=self._replicas)
        else:
            max_age_s, max_bytes = self._kv_stream_limits
            await ensure_kv_stream(
                self._js,
                self._subjects,
                max_age_s=max_age_s,
                max_bytes=max_bytes,
                replicas=self._replicas,
            )
