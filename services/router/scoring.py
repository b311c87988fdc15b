"""One decision's worker costs, and the choice among them without scoring every worker. Pure.

``Scorer`` holds what one request's cost on any worker depends on (its block hashes, the KV
index's overlaps, the active load) and scores one worker at a time (``selection.worker_cost``).

A worker with nothing of the prompt cached and nothing active costs exactly what every other
such worker costs (its "idle" cost); one with an overlap and nothing active costs what its
overlap depth costs. So ``choose_sparse`` costs one by one only the workers with requests in
flight, the overlapping ones once per depth and the idle ones once, and picks what scoring all
of them would pick: the lowest cost, a tie broken by ``rng.choice`` over the tied workers in
worker id order, as ``selection.pick`` does over the sorted candidates (idle ones included
without listing them). That holds at temperature 0 with the busy checks off (the defaults);
otherwise the router scores every worker (``RoutingCore``).
``tests/unit/router/test_sparse_choice.py`` checks both give the same worker on random fleets,
loads and prompts.
"""

from __future__ import annotations

import heapq
import math
import operator
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.router.fleet import Fleet
from services.router.indexer import RadixIndex
from services.router.load import ActiveLoad
from services.router.selection import worker_cost
from shared.messages import Candidate

_first = operator.itemgetter(0)


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


LISTED = 4
"""How many workers a sparse decision lists: the chosen one and the cheapest others."""


@dataclass(frozen=True, slots=True)
class SparseChoice:
    """The chosen worker, the few listed, and how the others were counted."""

    worker_id: str
    listed: list[Candidate]
    """The chosen worker and the cheapest others with state, up to ``LISTED``, by id."""
    idle_workers: int
    """Live workers with nothing of the prompt cached and nothing in flight, not listed: each
    costs ``idle_cost``."""
    idle_cost: float
    unlisted_workers: int
    """Workers with state (an overlap, requests in flight) scored but not listed."""


class _TiedWithIdle(Sequence[str]):
    """The tied workers when the idle ones tie too: every fleet id but the workers with state
    that did not tie, in id order, without building the list (``rng.choice`` indexes it)."""

    __slots__ = ("_gaps", "_ids")

    def __init__(self, ids: Sequence[str], gaps: list[int]) -> None:
        self._ids = ids
        self._gaps = sorted(gaps)

    def __len__(self) -> int:
        return len(self._ids) - len(self._gaps)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        if not 0 <= i < len(self):
            raise IndexError(i)
        for gap in self._gaps:  # skip the excluded positions at or before the target
            if gap <= i:
                i += 1
            else:
                break
        return self._ids[i]


def choose_sparse(
    scorer: Scorer,
    groups: Sequence[tuple[int, int]],
    index: RadixIndex,
    fleet: Fleet,
    rng: random.Random,
) -> SparseChoice:
    """The lowest-cost worker of ``fleet`` at temperature 0 with nobody busy: the same worker,
    and the same use of ``rng``, as scoring them all and ``selection.pick``.

    ``groups``: the workers caching a prefix of the prompt, by depth (``index.match_groups``,
    bit sets of ``index``); the scorer's ``overlaps`` are not read. Only the workers with
    requests in flight are costed one by one (``Scorer.score``, or its arithmetic inline for
    those without overlap); the others with an overlap cost what their depth costs, once per
    depth; the idle rest cost one figure.
    """
    hashes, block_size, weight = scorer.hashes, scorer.block_size, scorer.weight
    prompt_tokens, tail = scorer.prompt_tokens, scorer.tail
    nhashes = len(hashes)
    first = hashes[0] if hashes else None
    activity = scorer.load.activity()
    loaded = fleet.members.intersection(activity)  # walks the (few) workers with requests in flight
    loaded_bits = index.bits(loaded)
    free_bits = index.bits_cached(fleet, fleet.ids) & ~loaded_bits
    depth_of: dict[str, int] = {}
    unloaded: list[tuple[float, int, int, int]] = []  # (cost, depth, its workers' bits, count)
    unloaded_decode = float(nhashes + tail)

    def cost_at(depth: int) -> float:  # a worker with nothing in flight, ``depth`` cached
        new_prefill = prompt_tokens - depth * block_size
        return weight * ((new_prefill if new_prefill > 0 else 0) / block_size) + unloaded_decode

    for depth, group in groups:
        mine = group & loaded_bits
        if mine:
            for worker_id in index.ids(mine):
                depth_of[worker_id] = depth
        rest = group & free_bits
        if rest:
            unloaded.append((cost_at(depth), depth, rest, rest.bit_count()))
    # ``depth_of`` holds every loaded worker's overlap by now (and, below, the listed ones').
    listing = Scorer(
        hashes, depth_of, scorer.load, prompt_tokens, block_size, tail, weight, scorer.inflight
    )
    costs: list[tuple[float, str]] = []
    plain = weight * (prompt_tokens / block_size)  # nothing of it cached, nothing in flight
    fixed = nhashes + tail
    for worker_id in loaded:
        act = activity[worker_id]
        refs = act.refs
        if first in refs or worker_id in depth_of:  # an overlap, cached or in flight: in full
            costs.append((listing.score(worker_id).cost, worker_id))
            continue
        # Without overlap, ``Scorer.score``'s arithmetic reduces to this (no Candidate built).
        prefill = act.prefill_tokens
        new_cost = weight * ((prefill + prompt_tokens) / block_size) if prefill else plain
        costs.append((new_cost + float(len(refs) + act.own_blocks + fixed), worker_id))
    stateful = len(costs) + sum(count for _, _, _, count in unloaded)
    idle_workers = len(fleet) - stateful
    idle_cost = cost_at(0)
    unloaded.sort(key=_first)
    low = min(costs)[0] if costs else math.inf
    if unloaded and unloaded[0][0] < low:
        low = unloaded[0][0]
    if idle_workers and idle_cost < low:
        low = idle_cost
    tied_ids = [w for c, w in costs if c == low]
    for cost, _, bits, _ in unloaded:
        if cost == low:
            tied_ids.extend(index.ids(bits))
    tied: Sequence[str] = sorted(tied_ids)
    if idle_workers and idle_cost == low:
        untied = [w for c, w in costs if c != low]
        for cost, _, bits, _ in unloaded:
            if cost != low:
                untied.extend(index.ids(bits))
        tied = _TiedWithIdle(fleet.ids, [fleet.position[w] for w in untied])
    chosen = tied[0] if len(tied) == 1 else rng.choice(tied)
    # What to list: the chosen worker and the cheapest others (groups in cost order).
    top = heapq.nsmallest(LISTED, costs) if len(costs) > LISTED else sorted(costs)
    chosen_bit = index.bits((chosen,))
    for cost, depth, bits, _ in unloaded:
        if chosen_bit & bits:
            depth_of[chosen] = depth
        if len(top) < LISTED or cost <= top[-1][0]:
            for worker_id in sorted(index.ids(bits))[:LISTED]:
                depth_of[worker_id] = depth
                top.append((cost, worker_id))
            top.sort()
            del top[LISTED:]
    others = [w for _, w in top if w != chosen]
    listed_ids = sorted({chosen, *others[: LISTED - 1]})
    listed = [listing.score(w) for w in listed_ids]
    stateful_listed = sum(1 for w in listed_ids if w in depth_of or w in loaded)
    idle_left = idle_workers - (len(listed_ids) - stateful_listed)
    return SparseChoice(
        worker_id=chosen,
        listed=listed,
        idle_workers=idle_left,
        idle_cost=idle_cost if idle_left else 0.0,
        unlisted_workers=stateful - stateful_listed,
    )
