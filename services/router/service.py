"""Router wiring: ``route`` (queue group) -> ``RoutingCore`` -> the chosen worker + a decision.

Besides requests, every replica listens to what keeps replicas in agreement: the KV event stream
(``KvFeed``), every peer's ``RouteDecision``, workers' lifecycle events and load reports, cancels
and the worker registry. The lease holder snapshots the index (``SnapshotWriter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import bound_contextvars

from services.router.config import RouterConfig
from services.router.core import CoreSettings, RoutingCore
from services.router.kv_feed import KvFeed
from services.router.load import ActiveLoad, BusyThresholds, WorkerReports
from services.router.metrics import RouterMetrics
from services.router.snapshots import SnapshotWriter, load_snapshot
from services.router.sync import KvSync
from shared import codec
from shared.bounce import Bounces
from shared.bus import barrier, connect, wait_for_signal
from shared.errors import InternalError, NoWorkerAvailable, ServiceError
from shared.messages import (
    Cancel,
    Generate,
    RequestPhase,
    RouteDecision,
    WorkerCard,
    WorkerLoad,
)
from shared.metrics import serve_metrics
from shared.registry import WorkerDirectory, is_live
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

QUEUE_GROUP = "router"
MAX_ATTEMPTS = 3
SWEEP_INTERVAL_S = 1.0
M = TypeVar("M")

Attempt = tuple[Generate, tuple[str, ...]]
"""A forwarded request and the workers tried so far."""


def core_settings(config: RouterConfig) -> CoreSettings:
    """The decision knobs of a router configuration."""
    return CoreSettings(
        mode=config.router_mode,
        router_id=config.router_id,
        overlap_weight=config.kv_overlap_score_weight,
        temperature=config.router_temperature,
        use_kv_events=config.kv_events,
        inflight_overlap=config.inflight_overlap,
        busy=BusyThresholds(
            decode_blocks_frac=config.active_decode_blocks_threshold,
            prefill_tokens=config.active_prefill_tokens_threshold,
        ),
        busy_status=config.busy_status,
        busy_retry_after_s=config.busy_retry_after_s,
        seed=config.seed,
    )


class Router:
    """One router replica on an open NATS connection."""

    def __init__(
        self,
        config: RouterConfig,
        nc: Client,
        *,
        directory: WorkerDirectory | None = None,
        metrics: RouterMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._nc = nc
        self._clock = clock
        self._subjects = Subjects(config.namespace)
        self.metrics = metrics or RouterMetrics()
        self._directory = directory or WorkerDirectory(
            nc.jetstream(), self._subjects, ttl_s=config.worker_ttl_s, on_change=self._prune
        )
        self.core = RoutingCore(
            core_settings(config),
            load=ActiveLoad(config.request_ttl_s),
            reports=WorkerReports(config.load_stale_s),
        )
        self.core.approx.ttl_s = config.router_ttl_secs
        self.feed: KvFeed | None = None
        self.snapshots: SnapshotWriter | None = None
        self._rng = random.Random(config.seed)
        self._subs: list[Subscription] = []
        self._route_sub: Subscription | None = None
        self._bounces: Bounces[Attempt] = Bounces(nc, self._subjects, self._on_worker_missing)
        self._sweeper: asyncio.Task[None] | None = None
        self._seen_live: set[str] = set()
        self._unregistered_since: dict[str, float] = {}

    @property
    def router_id(self) -> str:
        return self._config.router_id

    def live(self, model: str) -> list[WorkerCard]:
        """The live workers of ``model`` as this replica sees them."""
        return self._directory.live(model)

    async def start(self) -> None:
        """Rebuild state (snapshot + stream), follow peers and workers, then take requests."""
        config = self._config
        if self.core.is_kv and config.kv_events:
            await self._start_kv_feed()
        subjects = self._subjects
        for subject, handler in (
            (subjects.decisions, self.on_decision),
            (subjects.lifecycle_all, self.on_lifecycle),
            (subjects.load_all, self.on_load),
            (subjects.cancel, self.on_cancel),
        ):
            self._subs.append(await self._nc.subscribe(subject, cb=handler))
        await self._directory.start()
        await self._bounces.start()
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="router-sweeper")
        self._route_sub = await self._nc.subscribe(
            subjects.route, queue=QUEUE_GROUP, cb=self.on_route
        )
        await barrier(self._nc)  # the server knows the subscriptions before we say "started"
        log.info(
            "router_started",
            mode=self.core.mode_label,
            router_id=self.router_id,
            namespace=config.namespace,
            stream_seq=self.core.sync.stream_seq,
        )

    async def _start_kv_feed(self) -> None:
        config = self._config
        js = self._nc.jetstream()
        snapshot = await load_snapshot(js, self._subjects)
        if snapshot is not None:
            self.core.sync = KvSync.restore(snapshot)
            log.info("snapshot_loaded", stream_seq=snapshot.stream_seq, by=snapshot.router_id)
        self.feed = KvFeed(
            self._nc,
            self._subjects,
            self.core.sync,
            self.metrics,
            router_id=self.router_id,
            dump_timeout_s=config.dump_timeout_s,
            clock=self._clock,
        )
        await self.feed.start(
            max_age_s=config.kv_stream_max_age_s, max_bytes=config.kv_stream_max_bytes
        )
        await self.feed.wait_caught_up(config.catchup_timeout_s)
        self.snapshots = SnapshotWriter(
            js,
            self._subjects,
            self.core.sync,
            self.metrics,
            router_id=self.router_id,
            interval_s=config.snapshot_interval_s,
            lease_ttl_s=config.lease_ttl_s,
            clock=self._clock,
        )
        await self.snapshots.start()

    async def stop(self) -> None:
        """Stop taking requests (finishing those already received), then stop following."""
        if self._route_sub is not None:
            with contextlib.suppress(Exception):
                await self._route_sub.drain()  # type: ignore[no-untyped-call]
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self.snapshots is not None:
            await self.snapshots.stop()
        if self.feed is not None:
            await self.feed.stop()
        await self._bounces.stop()
        await self._directory.stop()

    # --- requests ------------------------------------------------------------------------------
    async def on_route(self, msg: Msg) -> None:
        with self.metrics.base.handling("route"):
            try:
                gen = codec.decode(msg.data, Generate)
            except codec.DecodeError as exc:
                log.warning("bad_message", subject=msg.subject, error=str(exc))
                return
            with bound_contextvars(request_id=gen.request_id):
                await self._route(gen, ())

    def rng_for(self, request_id: str) -> random.Random:
        """Seeded: one generator per request, so every replica breaks its ties alike."""
        seed = self._config.seed
        return self._rng if seed is None else random.Random(f"{seed}:{request_id}")

    async def _route(self, gen: Generate, tried: tuple[str, ...]) -> None:
        """Send ``gen`` to a live worker not in ``tried``; failures go to the formatter."""
        try:
            now = self._clock()
            live = [c for c in self._directory.live(gen.model) if c.worker_id not in tried]
            decision = self.core.decide(gen, live, now=now, rng=self.rng_for(gen.request_id))
            self.core.commit(decision, now)
            routed = msgspec.structs.replace(gen, worker_id=decision.worker_id)
            # A worker gone since its last heartbeat bounces this back: retry another one.
            reply = self._bounces.reply_for(gen.request_id, (gen, (*tried, decision.worker_id)))
            await self._nc.publish(
                self._subjects.generate(decision.worker_id), codec.encode(routed), reply=reply
            )
            await self._nc.publish(self._subjects.decisions, codec.encode(decision))
        except ServiceError as exc:
            log.warning("request_rejected", code=exc.code, error=exc.message)
            self.metrics.base.error(exc.code)
            await self._fail(gen, exc)
            return
        except Exception:  # the handler boundary: log once, tell the client
            log.exception("route_failed")
            await self._fail(gen, InternalError("the router failed to route the request"))
            return
        self.metrics.decisions.labels(decision.mode).inc()
        self.metrics.overlap_blocks.observe(decision.overlap_blocks)
        log.info(
            "request_routed",
            worker_id=decision.worker_id,
            mode=decision.mode,
            overlap_blocks=decision.overlap_blocks,
            prompt_blocks=decision.prompt_blocks,
            costs={c.worker_id: round(c.cost, 3) for c in decision.candidates},
            retry=len(tried),
        )

    async def _on_worker_missing(self, request_id: str, attempt: Attempt, subject: str) -> None:
        gen, tried = attempt
        with bound_contextvars(request_id=request_id):
            log.warning("worker_unreachable", worker_id=tried[-1], subject=subject)
            self.core.on_cancel(request_id)
            if gen.worker_id is not None or len(tried) >= MAX_ATTEMPTS:
                await self._fail(gen, NoWorkerAvailable(f"worker {tried[-1]} is unreachable"))
                return
            await self._route(gen, tried)

    async def _fail(self, gen: Generate, exc: ServiceError) -> None:
        await self._nc.publish(gen.stream_to, codec.encode(exc.to_message(gen.request_id)))

    # --- what keeps replicas in agreement ------------------------------------------------------
    async def on_decision(self, msg: Msg) -> None:
        decision = self._decode(msg, RouteDecision)
        if decision is not None and decision.router_id != self.router_id:
            self.core.commit(decision, self._clock())

    async def on_lifecycle(self, msg: Msg) -> None:
        phase = self._decode(msg, RequestPhase)
        if phase is not None:
            self.core.on_phase(phase)

    async def on_load(self, msg: Msg) -> None:
        report = self._decode(msg, WorkerLoad)
        if report is not None:
            self.core.on_load(report, self._clock())

    async def on_cancel(self, msg: Msg) -> None:
        cancel = self._decode(msg, Cancel)
        if cancel is not None:
            self.core.on_cancel(cancel.request_id)

    @staticmethod
    def _decode(msg: Msg, kind: type[M]) -> M | None:
        try:
            return codec.decode(msg.data, kind)
        except codec.DecodeError as exc:
            log.warning("bad_message", subject=msg.subject, error=str(exc))
            return None

    # --- housekeeping --------------------------------------------------------------------------
    def _prune(self) -> None:
        """Drop the state of workers that left the registry (deleted or expired cards).

        A worker that was never registered (its events can precede its card) is dropped only
        after a worker TTL without a card.
        """
        now = self._clock()
        ttl_s = self._config.worker_ttl_s
        live = {w for w, c in self._directory.view.cards.items() if is_live(c, now, ttl_s)}
        self._seen_live |= live
        for worker_id in self.core.known_workers() - live:
            if worker_id not in self._seen_live:
                since = self._unregistered_since.setdefault(worker_id, now)
                if now - since < ttl_s:
                    continue
            self._seen_live.discard(worker_id)
            self._unregistered_since.pop(worker_id, None)
            if self.core.remove_worker(worker_id):
                log.info("worker_dropped", worker_id=worker_id)
        for worker_id in list(self._unregistered_since):
            if worker_id in live:
                del self._unregistered_since[worker_id]

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self.sweep()

    def sweep(self) -> None:
        """Expire stale requests and assumed blocks, drop departed workers, update gauges."""
        stale, dropped = self.core.sweep(self._clock())
        if stale or dropped:
            log.info("router_state_expired", requests=stale, approx_blocks=dropped)
        self._prune()
        index = self.core.approx.index if self.core.uses_approx else self.core.sync.index
        self.metrics.index_blocks.set(index.num_entries)
        self.metrics.index_nodes.set(index.num_nodes)
        self.metrics.active_requests.set(len(self.core.load))
        self.metrics.base.set_in_flight(len(self.core.load))


async def serve(config: RouterConfig, stop: asyncio.Event | None = None) -> None:
    """Run one router until SIGINT/SIGTERM (or ``stop``), then drain."""
    nc = await connect(config.nats_url, name="jetserve-router")
    router = Router(config, nc)
    serve_metrics(router.metrics.base, config.metrics_port)
    try:
        await router.start()
        await wait_for_signal(stop)
        log.info("shutdown_started")
        await router.stop()
    finally:
        await nc.drain()
