"""Router wiring: ``route`` (queue group) -> ``RoutingCore`` -> the chosen worker + a decision.

Besides requests, every replica listens to what keeps replicas in agreement: the KV event stream
(``KvFeed``), every peer's ``RouteDecision``, workers' lifecycle events and load reports, cancels
and the worker registry. It probes the workers it has requests on (``liveness.py``); a lost
worker's load is freed at once and ``WorkerLost`` names its requests, which their formatters
migrate (decision 017). The lease holder snapshots the index (``SnapshotWriter``). Every
subscription goes through the shared handler boundary (``shared.handlers``).

Disaggregated serving (decision 024): a request the core sends to a prefill worker goes there
first as a prefill phase (``Generate.prefill_to``); this replica waits for the answer
(``prefills.PrefillWaits``) and then sends the decode phase, with the answer's ``KvTransfer``, to
the decode worker. A prefill that fails (worker lost, bounced, timed out, retryable error) is
routed again without that worker; a query-only request is answered with a ``RouteChoice``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import bound_contextvars

from services.router.admission import Admission
from services.router.affinity import SessionAffinity
from services.router.config import RouterConfig
from services.router.core import CoreSettings, RoutingCore
from services.router.embeds import EmbedRouting
from services.router.kv_feed import KvFeed
from services.router.liveness import Liveness
from services.router.load import ActiveLoad, BusyThresholds, WorkerReports
from services.router.lora_placement import PlacementSettings
from services.router.lora_placer import LoraPlacer
from services.router.metrics import RouterMetrics
from services.router.prefills import Outcome as PrefillOutcome
from services.router.prefills import PrefillWaits
from services.router.session_store import SessionStore
from services.router.sessions import AffinityMode
from services.router.snapshots import SnapshotWriter, load_snapshot
from services.router.sync import KvSync
from services.router.thresholds import ModelThresholds
from services.router.workers import WorkerTracker
from shared import codec
from shared.bounce import Bounces
from shared.bus import barrier, drain_subscription
from shared.busy_thresholds import stored as stored_busy_thresholds
from shared.errors import InternalError, NoWorkerAvailable, ServiceError, from_message
from shared.handlers import Boundary
from shared.messages import (
    BusyThresholdsChanged,
    Cancel,
    Generate,
    PrefillResult,
    RequestFailed,
    RequestPhase,
    RouteChoice,
    RouteDecision,
    RouteQuery,
    RouteStatus,
    WorkerCard,
    WorkerLoad,
    WorkerLost,
)
from shared.metrics import ServiceMetrics
from shared.registry import WorkerDirectory
from shared.subjects import Subjects
from shared.targets import worker_of
from shared.tasks import TaskSet

log = structlog.get_logger(__name__)

QUEUE_GROUP = "router"
MAX_ATTEMPTS = 3
SWEEP_INTERVAL_S = 1.0
KNOWS_ALL_AFTER_S = 10.0
"""A router up this long has seen every decision of the requests still waiting for a token."""
RECONNECT_GRACE_S = 2.0
"""After this router reconnects to NATS, how long a worker's "no responders" proves nothing."""
MOVE_GRACE_S = 0.3
"""A live worker that answers a probe with "no responders" is asked once more after this long
before it is declared lost: on a NATS cluster a worker whose node went is away while it moves
to another node (7 to 90 ms measured; decision 018), and every worker on that node moves at
once, so losing them at the first "no responders" migrated their requests onto no worker."""

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
            prefill_tokens_frac=config.active_prefill_tokens_threshold_frac,
        ),
        busy_status=config.busy_status,
        busy_retry_after_s=config.busy_retry_after_s,
        seed=config.seed,
        conditional_disagg=config.router_conditional_disagg,
        disagg_min_tokens=config.disagg_min_prefill_tokens,
        disagg_local_overlap=config.disagg_local_overlap,
        enforce_disagg=config.enforce_disagg,
    )


def _stream_to(gen: Generate) -> str:
    return gen.stream_to


def _for_worker(gen: Generate, worker_id: str, dp_rank: int, **changes: Any) -> Generate:
    """``gen`` as one worker's rank gets it (a phase's ``changes`` too). The block hashes were
    for routing: the worker's engine hashes in its own way."""
    return msgspec.structs.replace(
        gen, worker_id=worker_id, dp_rank=dp_rank, block_hashes=(), hash_block_size=0, **changes
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
        self.metrics.identify(config.router_id)
        self._boundary = Boundary(nc, self.metrics.base)
        self._directory = directory or WorkerDirectory(
            nc.jetstream(), self._subjects, ttl_s=config.worker_ttl_s, on_change=self._prune
        )
        self.core = RoutingCore(
            core_settings(config),
            load=ActiveLoad(config.request_ttl_s, config.load_settle_after_s),
            reports=WorkerReports(config.load_stale_s),
        )
        self.core.approx.ttl_s = config.router_ttl_s
        self.admission = Admission(
            nc,
            self._subjects,
            config.admission_policy(),
            router_id=config.router_id,
            route=self._route_admitted,
            fail=self._fail,
            metrics=self.metrics,
            queue_max_length=config.queue_max_length,
            queue_max_wait_s=config.queue_max_wait_s,
            window_s=config.fairness_window_s,
            ledger_interval_s=config.ledger_interval_s,
            replicas=config.js_replicas,
            clock=clock,
        )
        self.placer = LoraPlacer(
            nc,
            self._subjects,
            router_id=config.router_id,
            cards=self._all_live_cards,
            settings=PlacementSettings(
                min_inflight=config.lora_min_inflight, imbalance=config.lora_imbalance
            ),
            interval_s=config.lora_placement_interval_s,
            cooldown_s=config.lora_cooldown_s,
            lease_ttl_s=config.lease_ttl_s,
            replicas=config.js_replicas,
            enabled=config.lora_placement,
        )
        """LoRA adapter placement (decision 031)."""
        self.embeds = EmbedRouting(nc, self._subjects, self._boundary, self.live, self.core.reports)
        self.sessions = self._session_affinity() if config.session_affinity_ttl_s > 0 else None
        self.feed: KvFeed | None = None
        self.snapshots: SnapshotWriter | None = None
        self._rng = random.Random(config.seed)
        self._subs: list[Subscription] = []
        self._route_sub: Subscription | None = None
        self._bounces: Bounces[Attempt] = Bounces(nc, self._subjects, self._on_worker_missing)
        self._tasks = TaskSet()
        self._prefills = PrefillWaits()
        self._workers = WorkerTracker(config.worker_ttl_s)
        self._thresholds = ModelThresholds()
        """Busy thresholds set per model at run time (``POST /busy_threshold``)."""
        self.liveness = Liveness(config.worker_unresponsive_s)
        self._reconnects = 0
        self._started_at = time.monotonic()
        self._reconnected_at = -RECONNECT_GRACE_S
        self._is_debug = log.is_enabled_for(logging.DEBUG)
        """Per-request lines are DEBUG; at INFO their fields are not even built."""

    @property
    def router_id(self) -> str:
        return self._config.router_id

    @property
    def service_metrics(self) -> ServiceMetrics:
        return self.metrics.base

    def live(self, model: str) -> Sequence[WorkerCard]:
        """The live workers of ``model`` as this replica sees them (lost ones left out): the
        directory's own list while none is lost, so the core's per-fleet state stays valid."""
        cards = self._directory.live(model)
        if not self.liveness.any_lost():
            return cards
        return [c for c in cards if not self.liveness.is_lost(c)]

    def _all_live_cards(self) -> list[WorkerCard]:
        """Every live worker's card, of every model (adapter placement)."""
        return [c for model in sorted(self._directory.models()) for c in self.live(model)]

    async def start(self) -> None:
        """Rebuild state (snapshot + stream), follow peers and workers, then take requests."""
        if self.core.is_kv and self._config.kv_events:
            await self._start_kv_feed()
        subjects, on = self._subjects, self._boundary.handler
        follow = {
            subjects.decisions: on(codec.decoder(RouteDecision), "decision", self.on_decision),
            subjects.lifecycle_all: on(codec.decoder(RequestPhase), "phase", self.on_phase),
            subjects.load_all: on(codec.decoder(WorkerLoad), "load", self.on_load),
            subjects.cancel: on(codec.decoder(Cancel), "cancel", self.on_cancel),
            subjects.worker_lost: on(codec.decoder(WorkerLost), "worker_lost", self.on_lost),
            subjects.busy_threshold: on(
                codec.decoder(BusyThresholdsChanged), "busy_threshold", self.on_busy_threshold
            ),
        }
        prefilled = on(codec.PREFILL_ANSWERS, "prefilled", self.on_prefilled)
        follow[subjects.prefill_result(self.router_id)] = prefilled
        for subject, callback in follow.items():
            self._subs.append(await self._nc.subscribe(subject, cb=callback))
        await self._directory.start()
        await self._bounces.start()
        is_read = await self._read_busy_thresholds()  # before the first request
        self._tasks.spawn(self._reread_busy_thresholds(is_read), name="router-busy-thresholds")
        if self.sessions is not None:  # bindings loaded before the first turn comes
            await self.sessions.start()
        self._tasks.spawn(self._sweep_loop(), name="router-sweeper")
        self._tasks.spawn(self._probe_loop(), name="router-prober")
        self._tasks.spawn(self._answer_queries_later(), name="router-route-status")
        await self.admission.start()  # the fleet's shares and budgets, before the first request
        on_route = on(codec.decoder(Generate), "route", self.on_route, reply_to=_stream_to)
        self._route_sub = await self._nc.subscribe(subjects.route, queue=QUEUE_GROUP, cb=on_route)
        await self.embeds.start()
        await self.placer.start()
        await barrier(self._nc)  # the server knows the subscriptions before we say "started"
        log.info(
            "router_started",
            mode=self.core.mode_label,
            router_id=self.router_id,
            stream_seq=self.core.sync.stream_seq,
        )

    async def _start_kv_feed(self) -> None:
        config = self._config
        js = self._nc.jetstream()
        snapshot = await load_snapshot(js, self._subjects, replicas=config.js_replicas)
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
            replicas=config.js_replicas,
            clock=self._clock,
        )
        await self.snapshots.start()

    async def stop(self) -> None:
        """Stop taking requests (finishing those already received), then stop following."""
        if self._route_sub is not None:
            await drain_subscription(self._route_sub)
        await self.admission.stop()
        await self.placer.stop()
        await self.embeds.stop()
        if self.sessions is not None:
            await self.sessions.stop()
        await self._tasks.close()
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
    async def on_route(self, gen: Generate) -> None:
        """Admit ``gen`` (budget, queue) and send it to a worker; a failure goes to the
        formatter (``gen.stream_to``)."""
        if gen.routing is not None and gen.routing.query_only:
            await self._route(gen, ())
            return
        await self.admission.admit(gen)

    async def _route_admitted(self, gen: Generate, queued_s: float) -> None:
        await self._route(gen, (), queued_s=queued_s)

    async def _fail(self, gen: Generate, error: ServiceError) -> None:
        """End a request that was admitted (queued) but cannot be served."""
        with bound_contextvars(request_id=gen.request_id):
            await self._boundary.fail(gen.stream_to, gen.request_id, error)

    def rng_for(self, request_id: str) -> random.Random:
        """Seeded: one generator per request, so every replica breaks its ties alike."""
        seed = self._config.seed
        return self._rng if seed is None else random.Random(f"{seed}:{request_id}")

    async def _route(self, gen: Generate, tried: tuple[str, ...], *, queued_s: float = 0.0) -> None:
        """Send ``gen`` to a live worker not in ``tried``; raises ``ServiceError`` if none
        (``AllWorkersBusy`` when every one is busy: the queue keeps it)."""
        now = self._clock()
        live = self.live(gen.model)
        if tried:
            live = [c for c in live if c.worker_id not in tried]
        turn = None if self.sessions is None else self.sessions.plan(gen, live, now)
        decision = self.core.decide(
            gen,
            live,
            now=now,
            rng=self.rng_for(gen.request_id),
            known=self._known_card,
            session_target=None if turn is None else turn.plan.target,
        )
        if gen.routing is not None and gen.routing.query_only:
            await self._answer_query(gen, decision)
            return
        if queued_s:
            decision = msgspec.structs.replace(decision, queued_ms=round(queued_s * 1000, 3))
        remote = decision.disagg == "remote" and gen.kv_transfer is None
        if not remote:
            routed = _for_worker(gen, decision.worker_id, decision.dp_rank)
            # A worker gone since its last heartbeat bounces this back: retry another one.
            reply = self._bounces.reply_for(gen.request_id, (gen, (*tried, decision.worker_id)))
            await self._nc.publish(
                self._subjects.generate(decision.worker_id), codec.encode(routed), reply=reply
            )
        # The bookkeeping after the request is on its way (the publish above does not wait
        # while the socket keeps up, so no other decision comes in between).
        self._count(decision, now)
        if turn is not None and self.sessions is not None:
            self.sessions.routed(gen, turn, decision, now)
        await self._nc.publish(self._subjects.decisions, codec.encode(decision))
        self.metrics.decisions.labels(decision.mode).inc()
        self.metrics.overlap_blocks.observe(decision.overlap_blocks)
        if decision.disagg:
            self.metrics.disagg.labels(decision.disagg).inc()
        if remote:
            self._tasks.spawn(self._disaggregated(gen, decision, tried), name="prefill")
        if self._is_debug:
            log.debug(
                "request_routed",
                worker_id=decision.worker_id,
                dp_rank=decision.dp_rank,
                prefill_worker_id=decision.prefill_worker_id,
                disagg=decision.disagg,
                mode=decision.mode,
                overlap_blocks=decision.overlap_blocks,
                prompt_blocks=decision.prompt_blocks,
                costs={c.worker_id: round(c.cost, 3) for c in decision.candidates},
                retry=len(tried),
            )

    def _session_affinity(self) -> SessionAffinity:
        config = self._config
        store = SessionStore(
            self._nc.jetstream(),
            self._subjects,
            ttl_s=config.session_affinity_ttl_s,
            router_id=config.router_id,
            replicas=config.js_replicas,
            clock=self._clock,
        )
        mode: AffinityMode = "hard" if config.session_affinity_mode == "hard" else "soft"
        return SessionAffinity(self._nc, self._subjects, store, self.core, self.metrics, mode=mode)

    def _known_card(self, worker_id: str) -> WorkerCard | None:
        """A worker's card whatever its state (for telling a dead pin from an unknown one)."""
        return self._directory.view.cards.get(worker_id)

    async def _answer_query(self, gen: Generate, decision: RouteDecision) -> None:
        """Query-only: say where ``gen`` would go; no state changes, nothing generated."""
        choice = RouteChoice(
            request_id=gen.request_id,
            worker_id=decision.worker_id,
            dp_rank=decision.dp_rank,
            prefill_worker_id=decision.prefill_worker_id,
            prefill_dp_rank=decision.prefill_dp_rank,
            token_ids=gen.token_ids,
            overlap_blocks=decision.overlap_blocks,
            prompt_tokens=len(gen.token_ids),
        )
        await self._nc.publish(gen.stream_to, codec.encode(choice))
        self.metrics.queries.inc()

    # --- disaggregated serving -------------------------------------------------------------------
    async def _disaggregated(
        self, gen: Generate, decision: RouteDecision, tried: tuple[str, ...]
    ) -> None:
        """The prefill phase on ``decision``'s prefill worker, then the decode phase."""
        request_id, prefill_id = gen.request_id, decision.prefill_worker_id
        with bound_contextvars(request_id=request_id):
            try:
                outcome = await self._prefill(gen, decision)
                if isinstance(outcome, PrefillResult):
                    await self._decode(gen, decision, outcome, tried)
                    return
                if outcome == "cancelled":
                    return
                reason = outcome if isinstance(outcome, str) else outcome.code
                failure = None if isinstance(outcome, str) else from_message(outcome)
                if failure is not None and not failure.retryable:
                    raise failure
                if len(tried) + 1 >= MAX_ATTEMPTS:
                    raise failure or NoWorkerAvailable(
                        f"prefill failed on {len(tried) + 1} workers (last: {reason})"
                    )
                log.warning("prefill_retried", prefill_worker_id=prefill_id, reason=reason)
                self.metrics.prefill_retries.labels(reason).inc()
                await self._route(gen, (*tried, prefill_id))
            except ServiceError as exc:
                await self._abandon(gen, exc)
            except Exception:  # a task's boundary: log once, 500
                log.exception("request_crashed", kind="prefill")
                await self._abandon(gen, InternalError("the router failed to route the request"))

    async def _prefill(self, gen: Generate, decision: RouteDecision) -> PrefillOutcome:
        """Send the prefill phase and wait for how it ended."""
        worker_id = decision.prefill_worker_id
        phase = _for_worker(
            gen,
            worker_id,
            decision.prefill_dp_rank,
            sampling=msgspec.structs.replace(gen.sampling, max_tokens=1, min_tokens=0, n=1),
            prefill_to=self._subjects.prefill_result(self.router_id),
        )
        self._prefills.expect(gen.request_id, worker_id)
        reply = self._bounces.reply_for(gen.request_id, (phase, (worker_id,)))
        await self._nc.publish(self._subjects.generate(worker_id), codec.encode(phase), reply=reply)
        return await self._prefills.wait(gen.request_id, worker_id, self._config.prefill_timeout_s)

    async def _decode(
        self,
        gen: Generate,
        decision: RouteDecision,
        result: PrefillResult,
        tried: tuple[str, ...],
    ) -> None:
        """Send the decode phase, with where to pull the prompt's KV from."""
        self.core.load.prefill_finished(gen.request_id)
        transfer = msgspec.structs.replace(result.kv_transfer, cached_tokens=result.cached_tokens)
        decode = _for_worker(gen, decision.worker_id, decision.dp_rank, kv_transfer=transfer)
        # A decode worker gone meanwhile bounces it: routed again, decode phase only.
        unpinned = msgspec.structs.replace(gen, kv_transfer=transfer)
        reply = self._bounces.reply_for(gen.request_id, (unpinned, (*tried, decision.worker_id)))
        await self._nc.publish(
            self._subjects.generate(decision.worker_id), codec.encode(decode), reply=reply
        )

    async def _abandon(self, gen: Generate, error: ServiceError) -> None:
        """End a disaggregated request that cannot be served: its formatter gets ``error``;
        every replica frees its load and the prefill worker unpins (a broadcast ``Cancel``)."""
        self.core.on_cancel(gen.request_id)
        await self._boundary.fail(gen.stream_to, gen.request_id, error)
        cancel = Cancel(request_id=gen.request_id, reason="prefill_failed")
        with contextlib.suppress(nats.errors.Error):
            await self._nc.publish(self._subjects.cancel, codec.encode(cancel))

    async def on_prefilled(self, answer: PrefillResult | RequestFailed) -> None:
        """A prefill worker's answer to a prefill phase this replica sent."""
        if not self._prefills.answer(answer):
            log.debug("prefill_answer_unexpected", request_id=answer.request_id)

    async def _on_worker_missing(self, request_id: str, attempt: Attempt, subject: str) -> None:
        """A bounce from a vanished worker: retry another one, or fail the request."""
        gen, tried = attempt
        if gen.prefill_to:  # a prefill phase: its waiting task routes it again
            self._probe_due([tried[-1]])
            self._prefills.end(request_id, "bounced")
            return
        with bound_contextvars(request_id=request_id):
            log.warning("worker_unreachable", worker_id=tried[-1], subject=subject)
            self.core.on_cancel(request_id)
            # Gone, or draining (it left the generate subject but still answers pings).
            self._probe_due([tried[-1]])
            try:
                if gen.worker_id is not None or len(tried) >= MAX_ATTEMPTS:
                    raise NoWorkerAvailable(f"worker {tried[-1]} is unreachable")
                await self._route(gen, tried)
            except ServiceError as exc:
                await self._boundary.fail(gen.stream_to, request_id, exc)
            except Exception:  # outside any handler, so this is the boundary: log once, 500
                log.exception("request_crashed", kind="reroute")
                failure = InternalError("the router failed to route the request")
                self.metrics.base.error(failure.code)
                await self._boundary.publish_failure(gen.stream_to, failure.to_message(request_id))

    # --- what keeps replicas in agreement ------------------------------------------------------
    async def on_decision(self, decision: RouteDecision) -> None:
        if decision.router_id != self.router_id:
            self._count(decision, self._clock())

    def _count(self, decision: RouteDecision, now: float) -> None:
        """A decision, this replica's or a peer's, in the active load and the admission ledger."""
        self.core.commit(decision, now)
        self.admission.on_decision(decision, now)
        self.placer.on_decision(decision)

    async def on_phase(self, phase: RequestPhase) -> None:
        self.core.on_phase(phase)
        if phase.phase == "finished":
            self.placer.on_end(phase.request_id)
        self.admission.on_phase(phase, self._clock())

    async def on_load(self, report: WorkerLoad) -> None:
        ended = self.core.on_load(report, self._clock())
        self.admission.wake()
        for request_id in ended:
            self.placer.on_end(request_id)
        if ended:
            self.metrics.unheard_ends.labels("load_report").inc(len(ended))
            log.info(
                "router_load_settled",
                worker_id=report.worker_id,
                ended=len(ended),
                running=report.active + report.waiting,
            )

    async def on_cancel(self, cancel: Cancel) -> None:
        worker_id, request_id = cancel.worker_id, cancel.request_id
        if worker_id is None and self.admission.cancel(request_id):
            return
        if worker_id is None:
            self._prefills.end(request_id, "cancelled")
        target = self.core.load.worker_of(request_id)
        if worker_id is None or (target is not None and worker_of(target) == worker_id):
            self.core.on_cancel(request_id)
            self.placer.on_end(request_id)

    async def on_busy_threshold(self, message: BusyThresholdsChanged) -> None:
        """A model's busy thresholds set at run time: applied unless this one is older."""
        if self._thresholds.apply(message):
            self.core.busy_by_model = self._thresholds.overrides
            self.admission.wake()  # raised thresholds may let queued requests go
            log.info(
                "busy_thresholds_applied",
                model=message.model,
                revision=message.revision,
                active_decode_blocks_threshold=message.active_decode_blocks_threshold,
                active_prefill_tokens_threshold=message.active_prefill_tokens_threshold,
                active_prefill_tokens_threshold_frac=message.active_prefill_tokens_threshold_frac,
            )

    async def _read_busy_thresholds(self) -> bool:
        """Apply the stored busy thresholds (set before this router started, or while it was
        away: a broadcast is not kept); False when the bucket could not be read."""
        try:
            stored = await stored_busy_thresholds(self._nc.jetstream(), self._subjects)
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("busy_thresholds_not_read", error=repr(exc))
            return False
        for message in stored:
            await self.on_busy_threshold(message)
        return True

    async def _reread_busy_thresholds(self, is_read: bool) -> None:
        """Read the bucket again after each reconnect to NATS (or after a failed read)."""
        read_at = self._nc.stats["reconnects"] if is_read else -1
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            reconnects = self._nc.stats["reconnects"]
            if (
                reconnects != read_at
                and self._nc.is_connected
                and await self._read_busy_thresholds()
            ):
                read_at = reconnects

    async def on_lost(self, lost: WorkerLost) -> None:
        """A peer found a worker lost: leave it out and free its load here too."""
        if lost.router_id != self.router_id and self.liveness.lose(lost.worker_id, self._clock()):
            self._prefills.lost(lost.worker_id)
            self.core.remove_worker(lost.worker_id)
            log.info("worker_lost_by_peer", worker_id=lost.worker_id, by=lost.router_id)

    async def _answer_queries_later(self) -> None:
        """Join the ``RouteQuery`` queue group once this router has seen every decision of the
        requests still waiting for a token: a younger one would call a request routed before it
        started unknown (lost). Queries meanwhile go to older replicas, if any (a young one that
        took its turn and stayed silent made a CI run's request wait for the gateway timeout)."""
        await asyncio.sleep(max(0.0, self._started_at + KNOWS_ALL_AFTER_S - time.monotonic()))
        sub = await self._nc.subscribe(
            self._subjects.route_status, queue=QUEUE_GROUP, cb=self._on_query
        )
        self._subs.append(sub)

    async def _on_query(self, msg: Msg) -> None:
        """Which worker has a request (every replica follows every decision, so any answers)."""
        try:
            query = codec.decode(msg.data, RouteQuery)
            load = self.core.load  # a request in its prefill phase is on its prefill worker
            target = load.prefill_worker_of(query.request_id) or load.worker_of(query.request_id)
            worker_id = None if target is None else worker_of(target)
            queued = worker_id is None and self.admission.holds(query.request_id, self._clock())
            status = RouteStatus(request_id=query.request_id, worker_id=worker_id, queued=queued)
            await msg.respond(codec.encode(status))
        except (codec.DecodeError, nats.errors.Error) as exc:
            log.warning("route_query_failed", error=str(exc))

    # --- liveness ------------------------------------------------------------------------------
    async def _probe_loop(self) -> None:
        interval_s = self._config.probe_interval_s
        while True:
            await asyncio.sleep(interval_s)
            if not self._nc.is_connected:
                continue
            self._probe_due(dict.fromkeys(worker_of(t) for t in self.core.load.workers()))
            self._probe_lost()

    def _probe_due(self, workers: Iterable[str]) -> None:
        """Probe each of ``workers`` that has no probe in flight (in a task of its own)."""
        for worker_id in self.liveness.due(workers, self._clock()):
            self._tasks.spawn(self._probe(worker_id), name=f"probe-{worker_id}")

    def _probe_lost(self) -> None:
        """Probe the lost workers whose cards are still live: one that answers is back."""
        cards = self._directory.view.cards
        lost = self.liveness.lost
        if not lost:
            return
        is_live = self._directory.is_live
        candidates = [w for w in lost if (card := cards.get(w)) is not None and is_live(card)]
        for worker_id in self.liveness.lost_due(candidates, self._clock()):
            self._tasks.spawn(self._probe(worker_id), name=f"probe-{worker_id}")

    def _just_reconnected(self) -> bool:
        """True for a while after this router's connection came back: workers reconnect too,
        a moment later, and "no responders" from them then says nothing."""
        reconnects = self._nc.stats["reconnects"]
        now = time.monotonic()
        if reconnects != self._reconnects:
            self._reconnects, self._reconnected_at = reconnects, now
        return now - self._reconnected_at < RECONNECT_GRACE_S

    async def _probe(self, worker_id: str) -> None:
        """Ping one worker: an answer, "no responders" twice ``MOVE_GRACE_S`` apart (lost now),
        or a timeout (silence)."""
        if not self._nc.is_connected or self._just_reconnected():
            self.liveness.dropped(worker_id)
            return
        subject = self._subjects.worker_ping(worker_id)
        timeout_s = self._config.probe_timeout_s
        try:
            try:
                await self._nc.request(subject, b"", timeout=timeout_s)
            except nats.errors.NoRespondersError:
                if self.liveness.has_lost(worker_id):
                    raise
                await asyncio.sleep(MOVE_GRACE_S)  # moving to another node, or gone?
                await self._nc.request(subject, b"", timeout=timeout_s)
        except nats.errors.NoRespondersError:
            if self._just_reconnected():
                self.liveness.dropped(worker_id)
                return
            await self._lose(worker_id, "no_responders")
        except nats.errors.TimeoutError:
            if self.liveness.timed_out(worker_id, self._clock()):
                await self._lose(worker_id, "unresponsive")
        except nats.errors.Error as exc:  # disconnected: nothing learned about the worker
            self.liveness.dropped(worker_id)
            log.debug("probe_not_sent", worker_id=worker_id, error=str(exc))
        else:
            if self.liveness.answered(worker_id):
                self._back(worker_id, "answered")

    async def _lose(self, worker_id: str, reason: str) -> None:
        """Leave the worker out, free its load, and tell formatters which requests were on it."""
        request_ids = tuple(self.core.load.requests_on(worker_id))
        if not self.liveness.lose(worker_id, self._clock()):
            return
        self._prefills.lost(worker_id)
        self.core.remove_worker(worker_id)
        self.metrics.workers_lost.labels(reason).inc()
        log.warning("worker_lost", worker_id=worker_id, reason=reason, requests=len(request_ids))
        lost = WorkerLost(
            worker_id=worker_id, request_ids=request_ids, reason=reason, router_id=self.router_id
        )
        try:
            await self._nc.publish(self._subjects.worker_lost, codec.encode(lost))
        except nats.errors.Error as exc:
            log.warning("worker_lost_not_sent", worker_id=worker_id, error=str(exc))

    def _back(self, worker_id: str, how: str) -> None:
        log.info("worker_back", worker_id=worker_id, how=how)
        if self.feed is not None:  # its blocks were dropped with it: learn them again
            self.feed.request_dump(worker_id)

    # --- housekeeping --------------------------------------------------------------------------
    def _prune(self) -> None:
        """Drop the state of workers that left the registry (``WorkerTracker`` decides which)."""
        now = self._clock()
        cards = self._directory.view.cards
        for worker_id in self.liveness.revive(cards.values(), now):
            self._back(worker_id, "heartbeat")
        is_live = self._directory.is_live  # time the registry could not be watched is excused
        live = {w for w, c in cards.items() if is_live(c) and not self.liveness.is_lost(c)}
        for worker_id in self._workers.departed(self.core.known_workers(), live, now):
            if self.core.remove_worker(worker_id):
                log.info("worker_dropped", worker_id=worker_id)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self.sweep()

    def sweep(self) -> None:
        """Expire stale requests and assumed blocks, drop departed workers, update gauges."""
        stale, dropped = self.core.sweep(self._clock())
        if stale or dropped:
            log.info("router_state_expired", requests=stale, approx_blocks=dropped)
        if stale:
            self.metrics.unheard_ends.labels("ttl").inc(stale)
        self._prune()
        index = self.core.approx.index if self.core.uses_approx else self.core.sync.index
        self.metrics.index_blocks.set(index.num_entries)
        self.metrics.index_nodes.set(index.num_nodes)
        self.metrics.active_requests.set(len(self.core.load))
        self.metrics.base.set_in_flight(len(self.core.load))
        self.admission.observe(self._clock())
