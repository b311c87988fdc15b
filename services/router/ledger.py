"""What admission decides from: tokens served per class and spent per tenant, over a window.

Every replica keeps the same ``Ledger``: it counts every decision (its own and its peers', which
carry the request's class, tenant, uncached and prompt tokens) and every ``finished`` phase
(output tokens, charged to the tenant of the decision it ends). So the figures agree across
replicas without a round trip. For durability each replica also stores what it admitted in the
``<NS>_ADMISSION`` stream (``pending`` -> ``AdmissionServed``); a router that starts replays the
window's records before it routes, so a restart or a new replica continues the shares and budgets
where the fleet is. Pure: times are passed in (wall clock seconds).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from shared.messages import AdmissionServed, RouteDecision

DEFAULT_WINDOW_S = 60.0
REQUEST_MEMORY_S = 600.0
"""How long a decision's tenant is kept for its ``finished`` (the router's request TTL)."""


class WindowCounts:
    """Per-key sums over the last ``window_s`` seconds, in one-second buckets."""

    __slots__ = ("_buckets", "_totals", "window_s")

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.window_s = window_s
        self._buckets: dict[str, deque[list[int]]] = {}
        """key -> [second, tokens] buckets, oldest first."""
        self._totals: dict[str, int] = {}

    def add(self, key: str, tokens: int, ts: float) -> None:
        if tokens <= 0:
            return
        second = int(ts)
        buckets = self._buckets.get(key)
        if buckets is None:
            buckets = self._buckets[key] = deque()
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += tokens
        elif not buckets or buckets[-1][0] < second:
            buckets.append([second, tokens])
        else:  # late (a replayed or delayed record): its own bucket, kept in order
            for i in range(len(buckets) - 1, -1, -1):
                if buckets[i][0] == second:
                    buckets[i][1] += tokens
                    break
                if buckets[i][0] < second:
                    buckets.insert(i + 1, [second, tokens])
                    break
            else:
                buckets.appendleft([second, tokens])
        self._totals[key] = self._totals.get(key, 0) + tokens

    def _evict(self, key: str, now: float) -> None:
        buckets = self._buckets.get(key)
        if not buckets:
            return
        oldest = now - self.window_s
        while buckets and buckets[0][0] + 1 <= oldest:
            self._totals[key] -= buckets.popleft()[1]
        if not buckets:
            del self._buckets[key]
            del self._totals[key]

    def total(self, key: str, now: float) -> int:
        self._evict(key, now)
        return self._totals.get(key, 0)

    def totals(self, now: float) -> dict[str, int]:
        for key in list(self._buckets):
            self._evict(key, now)
        return dict(self._totals)

    def retry_after(self, key: str, limit: int, now: float) -> float:
        """Seconds until the key's sum drops below ``limit`` (0 if it is below now)."""
        total = self.total(key, now)
        if total < limit:
            return 0.0
        for second, tokens in self._buckets.get(key, ()):
            total -= tokens
            if total < limit:
                return max(0.0, second + 1 + self.window_s - now)
        return self.window_s


@dataclass(slots=True)
class _Tracked:
    tenant: str
    own: bool
    expires_at: float


class Ledger:
    """Tokens served per class (uncached prompt) and spent per tenant (prompt + output)."""

    def __init__(self, router_id: str, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.router_id = router_id
        self.served = WindowCounts(window_s)
        self.spent = WindowCounts(window_s)
        self._tenants: dict[str, _Tracked] = {}  # insertion order = expiry order
        self._pending_served: dict[str, int] = {}
        self._pending_spent: dict[str, int] = {}

    def on_decision(self, decision: RouteDecision, default_class: str, now: float) -> None:
        """Count a routing decision (this replica's or a peer's)."""
        own = decision.router_id == self.router_id
        cls = decision.policy_class or default_class
        self.served.add(cls, decision.prefill_tokens, now)
        if own and decision.prefill_tokens:
            self._pending_served[cls] = self._pending_served.get(cls, 0) + decision.prefill_tokens
        tenant = decision.tenant
        if tenant:
            self._spend(tenant, decision.prompt_tokens, own, now)
            self._tenants.pop(decision.request_id, None)
            self._tenants[decision.request_id] = _Tracked(tenant, own, now + REQUEST_MEMORY_S)

    def on_finished(self, request_id: str, output_tokens: int, now: float) -> None:
        """A request ended: charge its output tokens to its tenant (once)."""
        tracked = self._tenants.pop(request_id, None)
        if tracked is not None:
            self._spend(tracked.tenant, output_tokens, tracked.own, now)

    def _spend(self, tenant: str, tokens: int, own: bool, now: float) -> None:
        self.spent.add(tenant, tokens, now)
        if own and tokens > 0:
            self._pending_spent[tenant] = self._pending_spent.get(tenant, 0) + tokens

    def replay(self, record: AdmissionServed) -> None:
        """A stored record (a router starting reads the window's records before it routes)."""
        for cls, tokens in record.served.items():
            self.served.add(cls, tokens, record.ts)
        for tenant, tokens in record.spent.items():
            self.spent.add(tenant, tokens, record.ts)

    def pending(self, now: float) -> AdmissionServed | None:
        """What this replica admitted since the last call, as a record to store (None: nothing)."""
        if not self._pending_served and not self._pending_spent:
            return None
        record = AdmissionServed(
            router_id=self.router_id,
            ts=now,
            served=self._pending_served,
            spent=self._pending_spent,
        )
        self._pending_served, self._pending_spent = {}, {}
        return record

    def sweep(self, now: float) -> None:
        """Forget tenants of requests whose end was never heard."""
        stale = []
        for request_id, tracked in self._tenants.items():
            if tracked.expires_at > now:
                break
            stale.append(request_id)
        for request_id in stale:
            del self._tenants[request_id]
