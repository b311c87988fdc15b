"""What ``jetserve top`` keeps of the bus messages it sees, per worker, router, policy class and
tenant. Pure: each ``on_*`` takes a decoded message and the monotonic time it arrived; nothing
here subscribes.

- ``WorkerLoad`` (``load.<worker_id>``): the latest running / waiting / KV blocks of a worker;
- ``TokenBatch`` (``stream.<formatter>.<request>``): tokens per worker, prompt and cached tokens
  of each request's first batch (the cache hit rate), and each finished request's mean time
  between tokens after its first batch (ITL, as the formatter receives them);
- ``RequestPhase`` (``lifecycle.<worker_id>``): requests finished per worker, and a finished
  request's output tokens, charged to the tenant of its decision (as the routers' admission
  ledger charges them);
- ``KvEventBatch`` (``kv.<worker_id>``): KV events per worker;
- ``RouteDecision`` (``decisions``): decisions per router, their overlap and prompt blocks; per
  policy class the uncached prompt tokens and queue waits; per tenant the prompt tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from services.cli.top.stats import Tally
from shared.messages import KvEventBatch, RequestPhase, RouteDecision, TokenBatch, WorkerLoad

KEEP_S = 60.0
"""How long events are kept: the longest window a frame can ask for."""
OPEN_REQUEST_TTL_S = 300.0
"""A request not finished after this long is forgotten (its last batch was lost)."""


@dataclass(slots=True)
class WorkerSeen:
    """One worker as the bus showed it."""

    load: WorkerLoad | None = None
    load_at: float = 0.0
    tokens: Tally = field(default_factory=lambda: Tally(KEEP_S))
    prompt_tokens: Tally = field(default_factory=lambda: Tally(KEEP_S))
    cached_tokens: Tally = field(default_factory=lambda: Tally(KEEP_S))
    finished: Tally = field(default_factory=lambda: Tally(KEEP_S))
    kv_events: Tally = field(default_factory=lambda: Tally(KEEP_S))


@dataclass(slots=True)
class RouterSeen:
    """One router replica's decisions (``overlap`` and ``prompt`` sum their blocks)."""

    decisions: Tally = field(default_factory=lambda: Tally(KEEP_S))
    overlap_blocks: Tally = field(default_factory=lambda: Tally(KEEP_S))
    prompt_blocks: Tally = field(default_factory=lambda: Tally(KEEP_S))


@dataclass(slots=True)
class ClassSeen:
    """One policy class's decisions (``uncached_tokens`` sums their uncached prompt tokens) and
    the queue waits of those that waited in a router queue."""

    decisions: Tally = field(default_factory=lambda: Tally(KEEP_S))
    uncached_tokens: Tally = field(default_factory=lambda: Tally(KEEP_S))
    waits: deque[tuple[float, float]] = field(default_factory=deque)
    """``(decided at, seconds queued)`` of each decision that waited, oldest first."""
    last_at: float = 0.0


@dataclass(slots=True)
class TenantSeen:
    """One tenant's decisions and tokens: prompt tokens at each decision, output tokens when
    the request finished."""

    requests: Tally = field(default_factory=lambda: Tally(KEEP_S))
    tokens: Tally = field(default_factory=lambda: Tally(KEEP_S, resolution_s=1.0))
    """Summed per second, as the routers' ledger sums them: only the last minute is read."""
    last_at: float = 0.0


@dataclass(slots=True)
class _Open:
    """A request whose tokens are streaming: when its first batch came and how many since."""

    first_at: float
    last_at: float
    first_tokens: int
    tokens: int


class BusEvents:
    """Everything ``top`` has seen on the bus, by worker, router and model."""

    def __init__(self) -> None:
        self.workers: dict[str, WorkerSeen] = {}
        self.routers: dict[str, RouterSeen] = {}
        self.decisions_by_model: dict[str, Tally] = {}
        self.itl: deque[tuple[float, float]] = deque()
        """``(finished at, mean seconds between tokens)`` of each finished request."""
        self._open: dict[tuple[str, int], _Open] = {}
        self.classes: dict[str, ClassSeen] = {}
        """By policy class (empty: the routers' default class)."""
        self.tenants: dict[str, TenantSeen] = {}
        self._tenant_of: dict[str, tuple[str, float]] = {}
        """Request id -> (its tenant, decided at), until its ``finished``; oldest first."""

    def worker(self, worker_id: str) -> WorkerSeen:
        seen = self.workers.get(worker_id)
        if seen is None:
            seen = self.workers[worker_id] = WorkerSeen()
        return seen

    def on_load(self, load: WorkerLoad, at: float) -> None:
        seen = self.worker(load.worker_id)
        seen.load, seen.load_at = load, at

    def tenant(self, name: str) -> TenantSeen:
        seen = self.tenants.get(name)
        if seen is None:
            seen = self.tenants[name] = TenantSeen()
        return seen

    def on_phase(self, phase: RequestPhase, at: float) -> None:
        """Count a finished request; its output tokens go to its decision's tenant, once."""
        if phase.phase != "finished":
            return
        self.worker(phase.worker_id).finished.add(at)
        if (tracked := self._tenant_of.pop(phase.request_id, None)) is not None:
            tenant = self.tenant(tracked[0])
            tenant.tokens.add(at, phase.output_tokens)
            tenant.last_at = at

    def on_kv(self, batch: KvEventBatch, at: float) -> None:
        self.worker(batch.worker_id).kv_events.add(at, len(batch.events))

    def on_decision(self, decision: RouteDecision, at: float) -> None:
        router = self.routers.get(decision.router_id)
        if router is None:
            router = self.routers[decision.router_id] = RouterSeen()
        router.decisions.add(at)
        router.overlap_blocks.add(at, decision.overlap_blocks)
        router.prompt_blocks.add(at, decision.prompt_blocks)
        tally = self.decisions_by_model.get(decision.model)
        if tally is None:
            tally = self.decisions_by_model[decision.model] = Tally(KEEP_S)
        tally.add(at)
        self._admission(decision, at)

    def _admission(self, decision: RouteDecision, at: float) -> None:
        """A decision's class and tenant figures, counted as the routers' ledger counts them (a
        request routed again is charged its prompt again)."""
        cls = self.classes.get(decision.policy_class)
        if cls is None:
            cls = self.classes[decision.policy_class] = ClassSeen()
        cls.decisions.add(at)
        cls.uncached_tokens.add(at, decision.prefill_tokens)
        cls.last_at = at
        if decision.queued_ms > 0:
            cls.waits.append((at, decision.queued_ms / 1000))
        _drop_before(cls.waits, at - KEEP_S)
        if decision.tenant:
            tenant = self.tenant(decision.tenant)
            tenant.requests.add(at)
            tenant.tokens.add(at, decision.prompt_tokens)
            tenant.last_at = at
            self._tenant_of.pop(decision.request_id, None)  # re-inserted: the order stays by time
            self._tenant_of[decision.request_id] = (decision.tenant, at)

    def on_tokens(self, batch: TokenBatch, at: float) -> None:
        """Count a batch's tokens; its request's first batch brings the prompt and cache
        figures, its last one closes the request's ITL."""
        if not batch.worker_id:
            return
        seen = self.worker(batch.worker_id)
        count = len(batch.token_ids)
        seen.tokens.add(at, count)
        key = (batch.request_id, batch.choice)
        if batch.index == 0:
            if batch.prompt_tokens:
                seen.prompt_tokens.add(at, batch.prompt_tokens)
                seen.cached_tokens.add(at, batch.cached_tokens)
            self._open[key] = _Open(at, at, count, count)
        elif (req := self._open.get(key)) is not None:
            req.tokens += count
            req.last_at = at
        if batch.finish_reason is not None and (req := self._open.pop(key, None)) is not None:
            after_first = req.tokens - req.first_tokens
            if after_first > 0:
                self.itl.append((at, (req.last_at - req.first_at) / after_first))
        _drop_before(self.itl, at - KEEP_S)

    def itl_since(self, start: float) -> list[float]:
        """Mean seconds between tokens of each request finished at or after ``start``."""
        return [itl for finished_at, itl in self.itl if finished_at >= start]

    def expire(self, now: float) -> None:
        """Forget requests whose last batch or decision came more than ``OPEN_REQUEST_TTL_S``
        ago, and classes and tenants with nothing in the last ``KEEP_S``."""
        stale = now - OPEN_REQUEST_TTL_S
        self._open = {key: req for key, req in self._open.items() if req.last_at >= stale}
        while self._tenant_of:
            request_id, (_, decided_at) = next(iter(self._tenant_of.items()))
            if decided_at >= stale:
                break
            del self._tenant_of[request_id]
        since = now - KEEP_S
        self.classes = {k: c for k, c in self.classes.items() if c.last_at >= since}
        self.tenants = {k: t for k, t in self.tenants.items() if t.last_at >= since}
        for cls in self.classes.values():
            _drop_before(cls.waits, since)


def _drop_before(events: deque[tuple[float, float]], start: float) -> None:
    """Drop the ``(at, value)`` pairs older than ``start`` (oldest first)."""
    while events and events[0][0] < start:
        events.popleft()
