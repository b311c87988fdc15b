"""The router queue: requests waiting for a worker under its busy thresholds. Pure.

A request waits when every eligible worker of its model is busy, or when any request of its
model waits at any replica (a new one must not pass those already waiting). Which one goes
next, when a worker frees up:

1. **Tier**: the highest ``strict_priority`` with requests waiting goes first, always.
2. **Class share**: deficit round robin between the policy classes waiting, in uncached prompt
   tokens, on the fleet's shared figures (``Shares``): a class may go unless it is more than one
   quantum ahead (its served tokens over its weight) of another class waiting at any replica.
   Of those that may, the one furthest behind goes.
3. **Deadline**: within a class, the earliest ``enqueued_at - priority`` (``priority`` is the
   seconds a request jumps ahead).

A replica holding only classes ahead of their share leaves the free worker to the replica that
holds the class behind: that is what keeps the shares across replicas with skewed ingress.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.router.ledger import Ledger
from shared.admission import AdmissionPolicy
from shared.messages import AdmissionBacklog, Generate

BACKLOG_TTL_S = 3.0
"""A peer's backlog record older than this is a router gone (records come every second)."""
LAG_QUANTA = 8
"""A class waiting again is lifted to at most this many quanta behind the class furthest ahead,
so a class idle for a while does not take every worker until its window catches up."""


@dataclass(slots=True, eq=False)
class Waiting:
    """One queued request."""

    gen: Generate
    policy_class: str
    tier: int
    order: float
    """``enqueued_at - priority``: earlier goes first within its class."""
    enqueued_at: float
    expires_at: float
    tokens: int
    seq: int = 0
    is_gone: bool = False

    @property
    def request_id(self) -> str:
        return self.gen.request_id


@dataclass(slots=True)
class _Lane:
    """One (tier, class)'s requests by order."""

    heap: list[tuple[float, int, Waiting]] = field(default_factory=list)
    live: int = 0
    tokens: int = 0

    def head(self) -> Waiting | None:
        heap = self.heap
        while heap and heap[0][2].is_gone:
            heapq.heappop(heap)
        return heap[0][2] if heap else None


class RouterQueue:
    """One model's waiting requests at this replica, bounded in length."""

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self._lanes: dict[tuple[int, str], _Lane] = {}
        self._by_id: dict[str, Waiting] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def push(self, waiting: Waiting) -> bool:
        """Queue ``waiting`` (False: the queue is full). Its place is kept by ``seq``, so a
        request put back after a failed try keeps its turn."""
        if len(self._by_id) >= self.max_length and waiting.request_id not in self._by_id:
            return False
        self.remove(waiting.request_id)
        if not waiting.seq:
            waiting.seq = next(self._seq) + 1
        waiting.is_gone = False
        lane = self._lanes.get((waiting.tier, waiting.policy_class))
        if lane is None:
            lane = self._lanes[(waiting.tier, waiting.policy_class)] = _Lane()
        heapq.heappush(lane.heap, (waiting.order, waiting.seq, waiting))
        lane.live += 1
        lane.tokens += waiting.tokens
        self._by_id[waiting.request_id] = waiting
        return True

    def remove(self, request_id: str) -> Waiting | None:
        waiting = self._by_id.pop(request_id, None)
        if waiting is None:
            return None
        waiting.is_gone = True
        key = (waiting.tier, waiting.policy_class)
        lane = self._lanes[key]
        lane.live -= 1
        lane.tokens -= waiting.tokens
        if not lane.live:
            del self._lanes[key]
        return waiting

    def expired(self, now: float) -> list[Waiting]:
        """Remove and return the requests that waited their longest."""
        gone = [w for w in self._by_id.values() if w.expires_at <= now]
        for waiting in gone:
            self.remove(waiting.request_id)
        return gone

    def backlog(self) -> dict[str, int]:
        """Policy class -> prompt tokens waiting (all tiers)."""
        found: dict[str, int] = {}
        for (_, cls), lane in self._lanes.items():
            found[cls] = found.get(cls, 0) + lane.tokens
        return found

    def next(self, shares: Shares, model: str, now: float) -> Waiting | None:
        """The request that goes next (left queued), or None when every class waiting here
        must leave the next worker to a class waiting elsewhere."""
        if not self._lanes:
            return None
        tier = max(t for t, _ in self._lanes)
        classes = [cls for t, cls in self._lanes if t == tier]
        local = set(self.backlog())
        cls = shares.choose(classes, model, local, now)
        if cls is None:
            return None
        return self._lanes[(tier, cls)].head()

    def waiting(self) -> Iterable[Waiting]:
        return self._by_id.values()


class Shares:
    """Which class may go next, from the fleet's served tokens and every replica's backlog."""

    def __init__(self, policy: AdmissionPolicy, ledger: Ledger) -> None:
        self.policy = policy
        self.ledger = ledger
        self._peers: dict[str, AdmissionBacklog] = {}
        self._seen: dict[str, float] = {}
        """Peer -> this replica's clock when its record came (clocks of hosts may differ)."""

    def on_backlog(self, record: AdmissionBacklog, now: float) -> None:
        if record.router_id != self.ledger.router_id:
            self._peers[record.router_id] = record
            self._seen[record.router_id] = now

    def waiting_elsewhere(self, model: str, now: float) -> set[str]:
        """Classes with requests of ``model`` waiting at a live peer."""
        found: set[str] = set()
        for router_id, record in self._peers.items():
            if now - self._seen[router_id] > BACKLOG_TTL_S:
                continue
            found.update(c for c, tokens in record.queued.get(model, {}).items() if tokens > 0)
        return found

    def holds(self, request_id: str, now: float) -> bool:
        """Whether a live peer has ``request_id`` in its queue."""
        return any(
            now - self._seen[router_id] <= BACKLOG_TTL_S and request_id in record.waiting
            for router_id, record in self._peers.items()
        )

    def forget_stale(self, now: float) -> None:
        for router_id in [r for r, t in self._seen.items() if now - t > BACKLOG_TTL_S]:
            del self._peers[router_id], self._seen[router_id]

    def choose(self, classes: Iterable[str], model: str, local: set[str], now: float) -> str | None:
        """Of ``classes`` (waiting here, in the top tier), the one that goes next, or None."""
        candidates = sorted(classes)
        waiting = local | self.waiting_elsewhere(model, now)
        if len(waiting) <= 1:
            return candidates[0] if candidates else None
        policy, served = self.policy, self.ledger.served
        norm = {c: served.total(c, now) / policy.weight(c) for c in waiting}
        quantum = policy.quantum_tokens
        floor = max(norm.values()) - LAG_QUANTA * quantum
        norm = {c: max(n, floor) for c, n in norm.items()}
        lowest = min(norm.values())
        allowed = [c for c in candidates if norm.get(c, lowest) <= lowest + quantum]
        if not allowed:
            return None
        return min(allowed, key=lambda c: (norm.get(c, lowest), c))
