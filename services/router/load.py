"""Active load per worker, as the routers see it. Pure: the clock is passed in.

``ActiveLoad`` follows every routed request (this replica's and its peers', from their
``RouteDecision``s) until the worker says ``finished``, a ``Cancel`` arrives, or it goes stale.
Per worker it keeps, as Dynamo's ``ActiveSequences`` does,

* **active prefill tokens**: the new (uncached) prompt tokens of requests not yet past prefill;
* **active decode blocks**: the distinct KV blocks of its running requests. Requests sharing a
  prefix share its blocks (reference-counted by sequence hash); a trailing partial block, and
  every block of a request routed without hashes, counts on its own.

A worker's own ``WorkerLoad`` settles what the routers count (``settle``): an end that was
never heard (a lifecycle message lost while nats-server was away, a request that died on its
way) would otherwise weigh on that worker's cost until the TTL, ten minutes later.

``WorkerReports`` keeps each worker's latest ``WorkerLoad``; a report older than ``stale_s`` is
ignored, so a busy mark expires when a worker stops reporting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shared.messages import WorkerLoad
from shared.targets import worker_of

DEFAULT_REQUEST_TTL_S = 600.0
DEFAULT_LOAD_STALE_S = 5.0
DEFAULT_SETTLE_AFTER_S = 2.0
"""A request routed this recently may not have reached its worker yet: a load report that
leaves it out does not end it."""


@dataclass(slots=True, eq=False)  # identity: one entry per request and phase
class _Request:
    request_id: str
    worker_id: str
    block_hashes: Sequence[int]
    own_blocks: int
    """Blocks not shared through a hash: the partial tail, or all of them without hashes."""
    prefill_tokens: int
    added_at: float
    expires_at: float
    is_prefill_phase: bool = False
    """A disaggregated request's entry on its prefill target (``ActiveLoad._prefills``)."""
    prefill_done: bool = False


@dataclass(slots=True)
class WorkerActivity:
    """One worker's requests in flight, as the cost model reads them."""

    refs: dict[int, int] = field(default_factory=dict)
    """Active block (sequence hash) -> how many requests hold it."""
    own_blocks: int = 0
    prefill_tokens: int = 0
    requests: int = 0
    held: set[_Request] = field(default_factory=set)
    """The entries counted here (what ``settle`` may end)."""


class ActiveLoad:
    """Requests in flight per worker, with shared-prefix block accounting.

    Workers here are routing targets (``shared.targets``: a data-parallel rank is one). A
    disaggregated request has two entries: its decode target's (the request itself) and, while
    its prefill runs, its prefill target's (``add_prefill``), freed by the prefill worker's
    ``finished``, by the decode phase's start or with the request.
    """

    def __init__(
        self,
        ttl_s: float = DEFAULT_REQUEST_TTL_S,
        settle_after_s: float = DEFAULT_SETTLE_AFTER_S,
    ) -> None:
        self.ttl_s = ttl_s
        self.settle_after_s = settle_after_s
        """``settle`` weighs entries at least this old; 0 = it ends nothing."""
        self._requests: dict[str, _Request] = {}  # insertion order = expiry order
        self._prefills: dict[str, _Request] = {}
        """Requests whose prefill runs on a prefill worker: that entry (disaggregated)."""
        self._workers: dict[str, WorkerActivity] = {}

    def add(
        self,
        request_id: str,
        worker_id: str,
        *,
        block_hashes: Sequence[int],
        prompt_blocks: int,
        prefill_tokens: int,
        now: float,
    ) -> None:
        """Count a request routed to ``worker_id`` (replacing an earlier route of it)."""
        self.free(request_id)
        req = self._attach(request_id, worker_id, block_hashes, prompt_blocks, prefill_tokens, now)
        self._requests[request_id] = req

    def add_prefill(
        self,
        request_id: str,
        worker_id: str,
        *,
        block_hashes: Sequence[int],
        prompt_blocks: int,
        prefill_tokens: int,
        now: float,
    ) -> None:
        """Count a disaggregated request's prefill on its prefill target (after ``add``)."""
        self.prefill_finished(request_id)
        req = self._attach(request_id, worker_id, block_hashes, prompt_blocks, prefill_tokens, now)
        req.is_prefill_phase = True
        self._prefills[request_id] = req

    def prefill_finished(self, request_id: str, worker_id: str | None = None) -> bool:
        """The request's prefill phase ended (on ``worker_id``'s targets, when given)."""
        req = self._prefills.get(request_id)
        if req is None or (worker_id is not None and worker_of(req.worker_id) != worker_id):
            return False
        del self._prefills[request_id]
        self._detach(req)
        return True

    def prefill_worker_of(self, request_id: str) -> str | None:
        """The prefill target of a request whose prefill phase runs."""
        req = self._prefills.get(request_id)
        return req.worker_id if req is not None else None

    def _attach(
        self,
        request_id: str,
        worker_id: str,
        block_hashes: Sequence[int],
        prompt_blocks: int,
        prefill_tokens: int,
        now: float,
    ) -> _Request:
        req = _Request(
            request_id=request_id,
            worker_id=worker_id,
            block_hashes=block_hashes,
            own_blocks=max(0, prompt_blocks - len(block_hashes)),
            prefill_tokens=prefill_tokens,
            added_at=now,
            expires_at=now + self.ttl_s,
        )
        worker = self._workers.get(worker_id)
        if worker is None:
            worker = self._workers[worker_id] = WorkerActivity()
        refs = worker.refs
        for h in block_hashes:
            refs[h] = refs.get(h, 0) + 1
        worker.own_blocks += req.own_blocks
        worker.prefill_tokens += prefill_tokens
        worker.requests += 1
        worker.held.add(req)
        return req

    def prefill_done(self, request_id: str, worker_id: str | None = None) -> None:
        """The worker finished the request's prefill: its prompt no longer loads prefill.
        (``worker_id``: the worker that said so; its prefill-phase entry when it has one.)"""
        req = self._prefills.get(request_id)
        if req is None or (worker_id is not None and worker_of(req.worker_id) != worker_id):
            req = self._requests.get(request_id)
        if req is None or req.prefill_done:
            return
        req.prefill_done = True
        self._workers[req.worker_id].prefill_tokens -= req.prefill_tokens

    def free(self, request_id: str) -> bool:
        """The request finished or was cancelled; True when it was tracked."""
        if self._prefills:
            self.prefill_finished(request_id)
        req = self._requests.pop(request_id, None)
        if req is None:
            return False
        self._detach(req)
        return True

    def _detach(self, req: _Request) -> None:
        worker = self._workers[req.worker_id]
        refs = worker.refs
        for h in req.block_hashes:
            left = refs[h] - 1
            if left:
                refs[h] = left
            else:
                del refs[h]
        worker.own_blocks -= req.own_blocks
        if not req.prefill_done:
            worker.prefill_tokens -= req.prefill_tokens
        worker.requests -= 1
        worker.held.discard(req)
        if worker.requests == 0:
            del self._workers[req.worker_id]

    def expire(self, now: float) -> list[str]:
        """Free and return the requests older than the TTL (their end was never heard)."""
        stale: list[str] = []
        for request_id, req in self._requests.items():
            if req.expires_at > now:
                break
            stale.append(request_id)
        for request_id in stale:
            self.free(request_id)
        for request_id in [r for r, q in self._prefills.items() if q.expires_at <= now]:
            self.prefill_finished(request_id)
        return stale

    def settle(self, worker_id: str, running: int, now: float) -> list[str]:
        """Worker ``worker_id`` says it holds ``running`` requests (running and waiting, all
        its ranks): end the oldest entries counted on it beyond that, and return their ids.

        Only entries at least ``settle_after_s`` old are weighed against the report, and the younger
        ones are assumed not in it, so a request on its way is never ended and a report can
        only end too few. The decode entry of a request whose prefill runs elsewhere is left
        out: its decode worker has not seen it yet.
        """
        grace_s = self.settle_after_s
        if grace_s <= 0 or self.counted_on(worker_id) <= running:  # usually: nothing to scan
            return []
        settled: list[_Request] = []
        for target, activity in self._workers.items():
            if worker_of(target) == worker_id:
                settled.extend(
                    r
                    for r in activity.held
                    if r.added_at <= now - grace_s
                    and (r.is_prefill_phase or r.request_id not in self._prefills)
                )
        excess = len(settled) - running
        if excess <= 0:
            return []
        settled.sort(key=lambda r: r.added_at)
        ended = []
        for req in settled[:excess]:
            if req.is_prefill_phase:
                self.prefill_finished(req.request_id)
            else:
                self.free(req.request_id)
            ended.append(req.request_id)
        return ended

    def counted_on(self, worker_id: str) -> int:
        """Entries counted on the targets of worker ``worker_id`` (prefill phases included)."""
        return sum(a.requests for t, a in self._workers.items() if worker_of(t) == worker_id)

    def worker_of(self, request_id: str) -> str | None:
        """The target a tracked request was routed to (its decode target when disaggregated)."""
        req = self._requests.get(request_id)
        return req.worker_id if req is not None else None

    def requests_on(self, worker_id: str) -> list[str]:
        """The tracked requests routed to the targets of worker ``worker_id`` (prefill-phase
        entries left out: the router that sent a prefill retries it, nobody migrates it)."""
        return [rid for rid, req in self._requests.items() if worker_of(req.worker_id) == worker_id]

    def remove_worker(self, worker_id: str) -> int:
        """Forget every request (and prefill-phase entry) on a worker that left; returns how
        many requests."""
        gone = self.requests_on(worker_id)
        for request_id in gone:
            self.free(request_id)
        prefills = [r for r, q in self._prefills.items() if worker_of(q.worker_id) == worker_id]
        for request_id in prefills:
            self.prefill_finished(request_id)
        return len(gone) + len(prefills)

    # --- per-worker figures --------------------------------------------------------------------
    def prefill_tokens(self, worker_id: str) -> int:
        worker = self._workers.get(worker_id)
        return worker.prefill_tokens if worker else 0

    def decode_blocks(self, worker_id: str) -> int:
        """Distinct KV blocks held by the worker's active requests."""
        worker = self._workers.get(worker_id)
        return len(worker.refs) + worker.own_blocks if worker else 0

    def requests(self, worker_id: str) -> int:
        worker = self._workers.get(worker_id)
        return worker.requests if worker else 0

    def figures(self, worker_id: str, block_hashes: Sequence[int]) -> tuple[int, int, int]:
        """Active prefill tokens, active decode blocks, and the prompt's new blocks there."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return 0, 0, len(block_hashes)
        return (
            worker.prefill_tokens,
            len(worker.refs) + worker.own_blocks,
            self.new_blocks(worker_id, block_hashes),
        )

    def new_blocks(self, worker_id: str, block_hashes: Sequence[int]) -> int:
        """How many of a prompt's hashed blocks are not already active on the worker.

        Active blocks are prefix-closed (a sequence hash implies its whole prefix), so the
        shared part is a prefix of the prompt, found by binary search.
        """
        worker = self._workers.get(worker_id)
        if worker is None or not block_hashes or block_hashes[0] not in worker.refs:
            return len(block_hashes)
        refs = worker.refs
        lo, hi = 1, len(block_hashes)  # block_hashes[:lo] are active; find the largest such lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if block_hashes[mid - 1] in refs:
                lo = mid
            else:
                hi = mid - 1
        return len(block_hashes) - lo

    def workers(self) -> list[str]:
        return sorted(self._workers)

    def activity(self) -> Mapping[str, WorkerActivity]:
        """Every worker with requests in flight and its figures (a view: read, never change)."""
        return self._workers

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests


@dataclass(frozen=True, slots=True)
class BusyThresholds:
    """Dynamo's busy checks; each is off while ``None``."""

    decode_blocks_frac: float | None = None
    """``--active-decode-blocks-threshold``: busy when used KV blocks / total > this (0..1)."""
    prefill_tokens: int | None = None
    """``--active-prefill-tokens-threshold``: busy when active prefill tokens > this."""
    prefill_tokens_frac: float | None = None
    """``--active-prefill-tokens-threshold-frac``: busy when active prefill tokens > this
    fraction of the worker's KV capacity in tokens (``kv_blocks * block_size`` of its card,
    which has no max-batched-tokens figure, Dynamo's base for it)."""

    @property
    def enabled(self) -> bool:
        return (
            self.decode_blocks_frac is not None
            or self.prefill_tokens is not None
            or self.prefill_tokens_frac is not None
        )


class WorkerReports:
    """The latest ``WorkerLoad`` of each worker, with the time it arrived."""

    def __init__(self, stale_s: float = DEFAULT_LOAD_STALE_S) -> None:
        self.stale_s = stale_s
        self._latest: dict[str, tuple[WorkerLoad, float]] = {}

    def update(self, load: WorkerLoad, now: float) -> None:
        self._latest[load.worker_id] = (load, now)

    def fresh(self, worker_id: str, now: float) -> WorkerLoad | None:
        """The worker's report if it is younger than ``stale_s``."""
        entry = self._latest.get(worker_id)
        if entry is None or now - entry[1] > self.stale_s:
            return None
        return entry[0]

    def remove_worker(self, worker_id: str) -> None:
        self._latest.pop(worker_id, None)


def is_busy(
    thresholds: BusyThresholds,
    *,
    report: WorkerLoad | None,
    tracked_prefill_tokens: int,
    kv_total_blocks: int = 0,
    kv_capacity_tokens: int = 0,
) -> bool:
    """Dynamo's busy rule for one worker.

    KV usage comes from the worker's own (fresh) report, since only the engine knows what it
    evicted; prefill tokens are the larger of the report and this router's own count.
    ``kv_total_blocks`` (from the worker card) stands in when the report has no total;
    ``kv_capacity_tokens`` (the card's blocks times its block size) is what
    ``prefill_tokens_frac`` is a fraction of (0: that check is off for the worker).
    """
    if thresholds.decode_blocks_frac is not None and report is not None:
        total = report.kv_total_blocks or kv_total_blocks
        if total > 0 and report.kv_used_blocks / total > thresholds.decode_blocks_frac:
            return True
    if thresholds.prefill_tokens is not None:
        reported = report.prefill_tokens if report is not None else 0
        if max(reported, tracked_prefill_tokens) > thresholds.prefill_tokens:
            return True
    frac = thresholds.prefill_tokens_frac
    if frac is not None and kv_capacity_tokens > 0:
        reported = report.prefill_tokens if report is not None else 0
        if max(reported, tracked_prefill_tokens) > frac * kv_capacity_tokens:
            return True
    return False
