"""Admission at a router replica: token budgets, the queue, and the ledger every replica shares.

``admit`` is where a request comes in: over its tenant's budget it is a 429; with nothing of
its model waiting anywhere it is routed at once; when every worker is busy, or requests of its
model already wait at some replica, it joins this replica's ``RouterQueue`` (full: 529).
A dispatcher sends queued requests as workers free up (woken by load reports, lifecycle events,
decisions and peers' backlog records, and a short tick while anything waits).

Shared state (decision 026): every replica counts every decision (``Ledger``); each stores what
it admitted in the ``<NS>_ADMISSION`` stream every ``ledger_interval_s`` and its backlog on
change, and a starting replica replays the window's records before it takes requests. Pure logic
lives in ``ledger.py`` and ``queue.py``; this module is their I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import (
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError

from services.router.ledger import Ledger
from services.router.metrics import RouterMetrics
from services.router.queue import RouterQueue, Shares, Waiting
from shared import codec
from shared.admission import AdmissionPolicy
from shared.errors import AllWorkersBusy, QueueFull, ServiceError, TokenBudgetExceeded
from shared.messages import (
    AdmissionBacklog,
    AdmissionServed,
    Generate,
    RequestPhase,
    RouteDecision,
)
from shared.subjects import Subjects
from shared.tasks import TaskSet

log = structlog.get_logger(__name__)

TICK_S = 0.05
"""While anything waits, the dispatcher looks again this often (held classes, expiry)."""
BACKLOG_MIN_INTERVAL_S = 0.05
BACKLOG_HEARTBEAT_S = 1.0
REPLAY_TIMEOUT_S = 5.0
STREAM_MAX_BYTES = 64 * 1024 * 1024

Route = Callable[[Generate, float], Awaitable[None]]
"""Send a request on (``core.decide`` + publish); raises ``AllWorkersBusy`` when all are busy.
The float is the seconds it waited in the queue."""
Fail = Callable[[Generate, ServiceError], Awaitable[None]]


class Admission:
    """Budgets, queue and shared ledger of one router replica."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        policy: AdmissionPolicy,
        *,
        router_id: str,
        route: Route,
        fail: Fail,
        metrics: RouterMetrics,
        queue_max_length: int,
        queue_max_wait_s: float,
        window_s: float,
        ledger_interval_s: float,
        replicas: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self.policy = policy
        self.router_id = router_id
        self._route = route
        self._fail = fail
        self._metrics = metrics
        self.max_length = queue_max_length
        self.max_wait_s = queue_max_wait_s
        self.window_s = window_s
        self._ledger_interval_s = ledger_interval_s
        self._replicas = replicas
        self._clock = clock
        self.ledger = Ledger(router_id, window_s)
        self.shares = Shares(policy, self.ledger)
        self.queues: dict[str, RouterQueue] = {}
        self._wake = asyncio.Event()
        self._tasks = TaskSet()
        self._sub: Subscription | None = None
        self._served: dict[str, Any] = {}
        """Policy class -> its ``served_tokens`` child (``labels`` costs a lookup each time)."""
        self._last_backlog: tuple[dict[str, dict[str, int]], frozenset[str]] = ({}, frozenset())
        self._backlog_at = 0.0

    @property
    def queueing(self) -> bool:
        return self.max_length > 0

    @property
    def waiting(self) -> int:
        """Requests waiting in this replica's queues (all models)."""
        return sum(len(q) for q in self.queues.values())

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Ensure the stream, replay the window's records, follow peers' backlogs."""
        await self._ensure_stream()
        replayed = await self._replay()
        subject = self._subjects.admission_backlog_all
        self._sub = await self._nc.subscribe(subject, cb=self._on_backlog)
        self._tasks.spawn(self._dispatch_loop(), name="admission-dispatch")
        self._tasks.spawn(self._ledger_loop(), name="admission-ledger")
        log.info("admission_started", replayed=replayed, classes=sorted(self.policy.classes))

    async def stop(self) -> None:
        await self._tasks.close()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        await self._store_served()
        for queue in self.queues.values():  # a stopping router answers what still waits
            for waiting in list(queue.waiting()):
                queue.remove(waiting.request_id)
                await self._fail(waiting.gen, QueueFull("the router is shutting down"))

    async def _ensure_stream(self) -> None:
        config = StreamConfig(
            name=self._subjects.admission_stream,
            subjects=[self._subjects.admission_all],
            retention=RetentionPolicy.LIMITS,
            max_age=self.window_s * 2,
            max_bytes=STREAM_MAX_BYTES,
            discard=DiscardPolicy.OLD,
            storage=StorageType.FILE,
            num_replicas=self._replicas,
        )
        jsx = self._nc.jetstream()
        try:
            await jsx.add_stream(config)
        except APIError:  # exists with other limits (another window): take these
            with contextlib.suppress(APIError):
                await jsx.update_stream(config)

    async def _replay(self) -> int:
        """Read the window's records (served tokens, peers' last backlogs) before routing."""
        jsx = self._nc.jetstream()
        try:
            info = await jsx.stream_info(self._subjects.admission_stream)
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("admission_replay_failed", error=repr(exc))
            return 0
        last = info.state.last_seq
        if not info.state.messages:
            return 0
        start = datetime.fromtimestamp(self._clock() - self.window_s, UTC)
        done = asyncio.Event()
        count = 0

        async def on_msg(msg: Msg) -> None:
            nonlocal count
            self._apply(msg.data)
            count += 1
            if msg.metadata.sequence.stream >= last:
                done.set()

        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME,
            opt_start_time=start,
        )
        sub = await jsx.subscribe(
            self._subjects.admission_all,
            stream=self._subjects.admission_stream,
            cb=on_msg,
            ordered_consumer=True,
            config=config,
        )
        try:
            await asyncio.wait_for(done.wait(), REPLAY_TIMEOUT_S)
        except TimeoutError:
            log.warning("admission_replay_incomplete", records=count, last_seq=last)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return count

    def _apply(self, data: bytes) -> None:
        try:
            record = codec.ADMISSION_RECORDS.decode(data)
        except codec.DecodeError:
            self._metrics.base.error("message_undecodable")
            return
        if isinstance(record, AdmissionServed):
            self.ledger.replay(record)
        else:
            self.shares.on_backlog(record, self._clock())

    # --- requests ------------------------------------------------------------------------------
    def check_budget(self, gen: Generate, now: float) -> None:
        """Raise ``TokenBudgetExceeded`` when the request's tenant has spent its minute."""
        routing = gen.routing
        tenant = routing.tenant if routing is not None else None
        if tenant is None:
            return
        budget = self.policy.budget(tenant)
        if budget is None:
            return
        spent = self.ledger.spent
        if spent.total(tenant, now) < budget:
            return
        self._metrics.budget_refusals.labels(tenant).inc()
        retry = max(1.0, spent.retry_after(tenant, budget, now))
        raise TokenBudgetExceeded(
            f"tenant {tenant!r} has used its {budget} tokens per minute", retry_after_s=retry
        )

    async def admit(self, gen: Generate) -> None:
        """Route ``gen`` now, or queue it (see the module docstring)."""
        now = self._clock()
        if gen.attempt == 0:
            self.check_budget(gen, now)
        if not self.queueing or gen.worker_id is not None:
            await self._route(gen, 0.0)
            return
        queue = self.queues.get(gen.model)
        if (queue is None or not len(queue)) and not self.shares.waiting_elsewhere(gen.model, now):
            try:
                await self._route(gen, 0.0)
                return
            except AllWorkersBusy:
                pass
        self._enqueue(gen, now)

    def _enqueue(self, gen: Generate, now: float) -> None:
        queue = self.queues.get(gen.model)
        if queue is None:
            queue = self.queues[gen.model] = RouterQueue(self.max_length)
        routing = gen.routing
        cls = (routing.policy_class if routing is not None else None) or self.policy.default_class
        priority = routing.priority if routing is not None else 0.0
        waiting = Waiting(
            gen=gen,
            policy_class=cls,
            tier=routing.strict_priority if routing is not None else 0,
            order=now - priority,
            enqueued_at=now,
            expires_at=now + self.max_wait_s,
            tokens=len(gen.token_ids),
        )
        if not queue.push(waiting):
            self._metrics.queue_outcomes.labels("full").inc()
            raise QueueFull(
                f"the router queue of model {gen.model} is full ({self.max_length} waiting)",
                retry_after_s=1.0,
            )
        self._metrics.queue_outcomes.labels("queued").inc()
        self._wake.set()

    def cancel(self, request_id: str) -> bool:
        """A cancelled request leaves the queue (True if it was waiting here)."""
        for queue in self.queues.values():
            if queue.remove(request_id) is not None:
                self._metrics.queue_outcomes.labels("cancelled").inc()
                self._wake.set()
                return True
        return False

    # --- what changes the picture ----------------------------------------------------------------
    def on_decision(self, decision: RouteDecision, now: float) -> None:
        self.ledger.on_decision(decision, self.policy.default_class, now)
        if decision.router_id == self.router_id and decision.prefill_tokens:
            cls = decision.policy_class or self.policy.default_class
            served = self._served.get(cls)
            if served is None:
                served = self._served[cls] = self._metrics.served_tokens.labels(cls)
            served.inc(decision.prefill_tokens)
        if self.waiting:
            self._wake.set()

    def on_phase(self, phase: RequestPhase, now: float) -> None:
        if phase.phase == "finished":
            self.ledger.on_finished(phase.request_id, phase.output_tokens, now)
        self.wake()

    def wake(self) -> None:
        if self.waiting:
            self._wake.set()

    async def _on_backlog(self, msg: Msg) -> None:
        try:
            record = codec.ADMISSION_RECORDS.decode(msg.data)
        except codec.DecodeError:
            self._metrics.base.error("message_undecodable")
            return
        if isinstance(record, AdmissionBacklog):
            self.shares.on_backlog(record, self._clock())
            self.wake()

    def observe(self, now: float) -> None:
        """Set the tenants' usage gauges (those with a budget)."""
        for tenant, tokens in self.ledger.spent.totals(now).items():
            budget = self.policy.budget(tenant)
            if budget is not None:
                self._metrics.tenant_tokens.labels(tenant).set(tokens)
                self._metrics.tenant_budget.labels(tenant).set(budget)

    # --- loops ---------------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        while True:
            timeout = TICK_S if self.waiting else BACKLOG_HEARTBEAT_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            try:
                await self.dispatch()
                await self._store_backlog()
            except Exception:  # the loop's boundary: log once, keep dispatching
                log.exception("admission_dispatch_failed")

    async def dispatch(self) -> None:
        """Send what may go now, in order, until workers are busy or classes must wait."""
        now = self._clock()
        for model, queue in list(self.queues.items()):
            for waiting in queue.expired(now):
                self._metrics.queue_outcomes.labels("expired").inc()
                waited = now - waiting.enqueued_at
                await self._fail(
                    waiting.gen,
                    QueueFull(f"waited {waited:.1f} s in the router queue", retry_after_s=1.0),
                )
            while (head := queue.next(self.shares, model, now)) is not None:
                waiting = head
                queue.remove(waiting.request_id)
                waited = now - waiting.enqueued_at
                try:
                    await self._route(waiting.gen, waited)
                except AllWorkersBusy:
                    queue.push(waiting)
                    break
                except ServiceError as exc:
                    await self._fail(waiting.gen, exc)
                    continue
                self._metrics.queue_outcomes.labels("routed").inc()
                self._metrics.queue_wait.observe(waited)
                now = self._clock()
        self._metrics.queue_depth.set(self.waiting)

    def holds(self, request_id: str, now: float) -> bool:
        """Whether ``request_id`` waits in this replica's queue or a live peer's."""
        return any(request_id in q for q in self.queues.values()) or self.shares.holds(
            request_id, now
        )

    async def _store_backlog(self) -> None:
        """Tell the fleet what waits here: on change (rate-limited) and every second while
        anything waits (and once more when the queue empties)."""
        now = self._clock()
        since = now - self._backlog_at
        if since < BACKLOG_MIN_INTERVAL_S:
            return
        backlog = {m: b for m, q in self.queues.items() if (b := q.backlog())}
        waiting = frozenset(w.request_id for q in self.queues.values() for w in q.waiting())
        last_backlog, last_waiting = self._last_backlog
        changed = backlog != last_backlog or waiting != last_waiting
        if changed or (since >= BACKLOG_HEARTBEAT_S and waiting):
            record = AdmissionBacklog(
                router_id=self.router_id, ts=now, queued=backlog, waiting=tuple(waiting)
            )
            with contextlib.suppress(nats.errors.Error):
                await self._nc.publish(
                    self._subjects.admission_backlog(self.router_id), codec.encode(record)
                )
            self._last_backlog, self._backlog_at = (backlog, waiting), now
        self.shares.forget_stale(now)

    async def _ledger_loop(self) -> None:
        while True:
            await asyncio.sleep(self._ledger_interval_s)
            await self._store_served()
            self.ledger.sweep(self._clock())

    async def _store_served(self) -> None:
        record = self.ledger.pending(self._clock())
        if record is None:
            return
        with contextlib.suppress(nats.errors.Error):
            await self._nc.publish(
                self._subjects.admission_served(self.router_id), codec.encode(record)
            )
