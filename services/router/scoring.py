"""One decision's worker costs, and the choice among them without scoring every worker. Pure.

``Scorer`` holds what one request's cost on any worker depends on (its block hashes, the KV
index's overlaps, the active load) and scores one worker at a time (``selection.worker_cost``).

A worker with nothing of the prompt cached and nothing active costs exactly what every other
such worker costs (its "idle" cost). So ``choose_sparse`` scores only the workers with state
(an overlap, or requests in flight) one by one, the idle ones once, and picks what scoring all of
them would pick: the lowest cost, a tie broken by ``rng.choice`` over the tied workers in worker
id order, as ``selection.pick`` does over the sorted candidates. That holds at temperature 0
with the busy checks off (the defaults); otherwise the router scores every worker
(``RoutingCore``). ``tests/unit/router/test_sparse_choice.py`` checks both give the same worker
on random fleets, loads and prompts.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from services.router.load import ActiveLoad
from services.router.selection import worker_cost
from shared.messages import Candidate

IDLE = ""
"""The id an idle worker is scored under (the load tracker knows no such worker)."""


@dataclass(frozen=True, slots=True)
class Scorer:
    """What one request's cost on a worker depends on."""

    hashes: Sequence[int]
    overlaps: Mapping[str, int]
    load: ActiveLoad
    prompt_tokens: int
    block_size: int
    tail: int
    """Prompt blocks that are not full (no hash): new on every worker."""
    weight: float
    inflight: bool
    """An in-flight prefix counts as overlap (``--inflight-overlap``)."""

    def score(self, worker_id: str, busy: bool = False) -> Candidate:
        hashes, block_size = self.hashes, self.block_size
        prefill, decode, new = self.load.figures(worker_id, hashes)
        cached = self.overlaps.get(worker_id, 0)
        pending = 0
        if self.inflight:
            # Active blocks are prefix-closed: the first len(hashes) - new are being computed
            # (or held) there by requests routed earlier, which the engine schedules first.
            # Their prefill is work this request needs done anyway, not a queue it waits
            # behind elsewhere: an in-flight prefix costs what a cached one does. (If that
            # prefill is already done but its KV events are not in yet, this discounts other
            # requests' prefill for those few milliseconds.)
            pending = max(0, len(hashes) - new - cached)
            prefill = max(0, prefill - pending * block_size)
        return worker_cost(
            worker_id,
            cached + pending,
            prefill,
            decode,
            new + self.tail,
            self.prompt_tokens,
            block_size,
            self.weight,
            busy,
            pending,
        )

    def stateful(self, live: Collection[str]) -> list[str]:
        """The live workers whose cost is their own (an overlap, or requests in flight), by id."""
        ids = set(self.overlaps)
        ids.update(self.load.active_workers())
        return sorted(w for w in ids if w in live)


@dataclass(frozen=True, slots=True)
class SparseChoice:
    """The chosen worker, the workers scored one by one, and the idle ones' shared cost."""

    worker_id: str
    scored: list[Candidate]
    idle_workers: int
    """Live workers not in ``scored``: each costs ``idle.cost``."""
    idle: Candidate


def choose_sparse(scorer: Scorer, live: Collection[str], rng: random.Random) -> SparseChoice:
    """The lowest-cost worker among ``live`` (temperature 0, nobody busy), scoring only the
    workers with state; the same worker, and the same use of ``rng``, as scoring them all."""
    scored = [scorer.score(w) for w in scorer.stateful(live)]
    idle_workers = len(live) - len(scored)
    idle = scorer.score(IDLE)
    costs = [c.cost for c in scored]
    if idle_workers:
        costs.append(idle.cost)
    low = min(costs)
    tied = [c.worker_id for c in scored if c.cost == low]
    if idle_workers and idle.cost == low:
        if scored:
            known = {c.worker_id for c in scored}
            tied = sorted([*tied, *(w for w in live if w not in known)])
        else:
            tied = sorted(live)
    chosen = tied[0] if len(tied) == 1 else rng.choice(tied)
    return SparseChoice(chosen, scored, idle_workers, idle)
