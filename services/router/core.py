"""The router's decision core: live workers + KV index + active load -> one ``RouteDecision``.

Pure: no I/O; the clock (``now``) and the random generator come in as arguments, so replicas
that saw the same events and decisions, given the same generator, decide the same way. The
wiring (``service.py``) feeds it KV events (through ``KvSync``), peers' decisions, lifecycle
events, cancels and load reports, and publishes what ``decide`` returns.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.router.approx import ApproxIndex
from services.router.fleet import Fleet, FleetCache
from services.router.load import ActiveLoad, BusyThresholds, WorkerReports, is_busy
from services.router.policy import Policy, build_policy
from services.router.scoring import Scorer, choose_sparse
from services.router.selection import allowed_workers, pick
from services.router.sync import KvSync
from shared.errors import (
    AllWorkersBusy,
    AllWorkersOverloaded,
    InvalidRequest,
    NotFound,
    NoWorkerAvailable,
)
from shared.hashing import extend_prefix_hashes, prefix_hashes
from shared.messages import (
    Candidate,
    Generate,
    RequestPhase,
    RouteDecision,
    RoutingHints,
    WorkerCard,
    WorkerLoad,
)

KV_MODES = ("kv",)
LIST_ALL_UP_TO = 32
"""Up to this many workers every worker is scored and listed in the decision; beyond, in kv
mode, the sparse computation lists the chosen worker and the cheapest others
(``scoring.LISTED`` in all), and counts the rest: ``idle_workers`` at ``idle_cost``, and
``unlisted_workers`` with state of their own."""
_NO_HINTS = RoutingHints()


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreSettings:
    """The decision knobs (from ``RouterConfig``)."""

    mode: str = "round-robin"
    router_id: str = "router"
    overlap_weight: float = 1.0
    temperature: float = 0.0
    use_kv_events: bool = True
    """kv mode only: False = approximate index (``--no-kv-events``)."""
    inflight_overlap: bool = True
    """kv mode only: a prompt prefix that requests already routed to a worker are computing
    counts as overlap there (the engine reuses blocks once scheduled, as vLLM v1 does)."""
    busy: BusyThresholds = field(default_factory=BusyThresholds)
    busy_status: int = 503
    busy_retry_after_s: float = 1.0
    seed: int | None = None


class RoutingCore:
    """Decides where each request goes and keeps the state every replica shares."""

    def __init__(
        self,
        settings: CoreSettings,
        *,
        sync: KvSync | None = None,
        approx: ApproxIndex | None = None,
        load: ActiveLoad | None = None,
        reports: WorkerReports | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.settings = settings
        self.is_kv = settings.mode in KV_MODES
        self.sync = sync if sync is not None else KvSync()
        self.approx = approx if approx is not None else ApproxIndex()
        self.load = load if load is not None else ActiveLoad()
        self.reports = reports if reports is not None else WorkerReports()
        self.eventless: set[str] = set()
        """Workers whose card says their engine publishes no KV events: their cache is
        estimated from the routing decisions (approximate), whatever the mode."""
        self._policy = policy
        self._fleets = FleetCache()
        if policy is None and settings.mode in ("round-robin", "random"):
            self._policy = build_policy(settings.mode, seed=settings.seed)

    @property
    def uses_approx(self) -> bool:
        return self.is_kv and not self.settings.use_kv_events

    # --- deciding ------------------------------------------------------------------------------
    def decide(
        self, gen: Generate, live: Sequence[WorkerCard], *, now: float, rng: random.Random
    ) -> RouteDecision:
        """Where ``gen`` goes among the ``live`` workers of its model; changes no state.

        In kv mode beyond ``LIST_ALL_UP_TO`` workers, at temperature 0 with the busy checks off
        (the defaults), only the workers with state (an overlap, requests in flight) are scored
        one by one and the idle rest once (``scoring.choose_sparse``): the same choice as
        ``decide_exhaustive``, at a cost that grows with the workers that hold something of the
        request, not with the fleet.

        Raises:
            NotFound: the request pins a worker that is not live (404).
            InvalidRequest: ``direct`` mode and the request pins no worker (400).
            NoWorkerAvailable: no live worker serves the model (503).
            AllWorkersBusy: every live worker is over a busy threshold (503 or 529).
        """
        fleet = self._fleet(gen, live)
        hints = gen.routing or _NO_HINTS
        sparse = (
            self.is_kv
            and len(fleet) > LIST_ALL_UP_TO
            and (self.uses_approx or not fleet.eventless)
            and gen.worker_id is None
            and not self.settings.busy.enabled
            and self._temperature(hints) <= 0.0
        )
        return self._decide(gen, fleet, hints, now, rng, sparse=sparse)

    def decide_exhaustive(
        self, gen: Generate, live: Sequence[WorkerCard], *, now: float, rng: random.Random
    ) -> RouteDecision:
        """``decide`` with every worker scored one by one, whatever the settings: the
        straightforward computation that the sparse one must agree with."""
        fleet = self._fleet(gen, live)
        return self._decide(gen, fleet, gen.routing or _NO_HINTS, now, rng, sparse=False)

    def _decide(
        self,
        gen: Generate,
        fleet: Fleet,
        hints: RoutingHints,
        now: float,
        rng: random.Random,
        *,
        sparse: bool,
    ) -> RouteDecision:
        pinned = gen.worker_id is not None
        block_size = fleet.block_size
        hashes: Sequence[int] = ()
        overlaps: dict[str, int] = {}
        groups: list[tuple[int, int]] = []
        matcher = self.approx.index if self.uses_approx else self.sync.index
        if self.is_kv:
            hashes = self._hashes(gen, block_size, hints)
            if sparse:
                groups = matcher.match_groups(hashes)
            else:
                overlaps = matcher.find_matches(hashes)
                if not self.uses_approx and fleet.eventless:
                    overlaps = self._estimate_eventless(fleet.eventless, hashes, overlaps)
        prompt_tokens = len(gen.token_ids)
        prompt_blocks = -(-prompt_tokens // block_size)
        weight = hints.overlap_score_weight
        scorer = Scorer(
            hashes=hashes,
            overlaps=overlaps,
            load=self.load,
            prompt_tokens=prompt_tokens,
            block_size=block_size,
            tail=prompt_blocks - len(hashes),
            weight=self.settings.overlap_weight if weight is None else weight,
            inflight=self.is_kv and self.settings.inflight_overlap,
        )
        idle_workers, idle_cost, unlisted = 0, 0.0, 0
        if sparse:
            choice = choose_sparse(scorer, groups, matcher, fleet, rng)
            candidates = choice.listed
            idle_workers, idle_cost = choice.idle_workers, choice.idle_cost
            unlisted = choice.unlisted_workers
            best = next(c for c in candidates if c.worker_id == choice.worker_id)
        elif self._policy is not None and not pinned and not self.settings.busy.enabled:
            # round-robin / random: the policy picks; costs are only shown (a small fleet's all)
            chosen = self._policy.choose(gen, fleet.cards).worker_id
            if len(fleet) <= LIST_ALL_UP_TO:
                candidates = [scorer.score(w) for w in fleet.ids]
            else:
                candidates = [scorer.score(chosen)]
                unlisted = len(fleet) - 1
            best = next(c for c in candidates if c.worker_id == chosen)
        else:
            cards = fleet.cards
            check_busy = not pinned and self.settings.busy.enabled
            candidates = [
                scorer.score(c.worker_id, check_busy and self._is_busy(c, now)) for c in cards
            ]
            best = candidates[self._choose(gen, cards, candidates, hints, rng)]
        return RouteDecision(
            request_id=gen.request_id,
            router_id=self.settings.router_id,
            worker_id=best.worker_id,
            model=gen.model,
            mode="direct" if pinned else self.mode_label,
            prompt_blocks=prompt_blocks,
            overlap_blocks=best.overlap_blocks,
            prefill_tokens=max(0, prompt_tokens - best.overlap_blocks * block_size),
            candidates=tuple(candidates),
            ts=now,
            prompt_tokens=prompt_tokens,
            block_hashes=tuple(hashes),
            idle_workers=idle_workers,
            idle_cost=idle_cost,
            unlisted_workers=unlisted,
        )

    @staticmethod
    def _hashes(gen: Generate, block_size: int, hints: RoutingHints) -> Sequence[int]:
        """The prompt's block hashes: the preprocessor's when they are at this block size
        (extended over tokens appended since, as a migrated request's), else hashed here."""
        lora, salt = hints.lora_name, hints.cache_salt
        if gen.hash_block_size == block_size and gen.block_hashes:
            return extend_prefix_hashes(
                gen.token_ids, block_size, gen.block_hashes, lora_name=lora, cache_salt=salt
            )
        return prefix_hashes(gen.token_ids, block_size, lora_name=lora, cache_salt=salt)

    @property
    def mode_label(self) -> str:
        """The mode as decisions and metrics name it (``kv-approx`` without KV events)."""
        return "kv-approx" if self.uses_approx else self.settings.mode

    def _fleet(self, gen: Generate, live: Sequence[WorkerCard]) -> Fleet:
        """The workers ``gen`` may go to (raises when there are none)."""
        fleet = self._fleets.get(gen.model, live)
        if gen.worker_id is not None:
            at = fleet.position.get(gen.worker_id)
            if at is None:
                raise NotFound(
                    f"worker {gen.worker_id} is not a live worker of model {gen.model}",
                    param="worker_id",
                )
            return Fleet.of([fleet.cards[at]])
        if self.settings.mode == "direct":
            raise InvalidRequest(
                "router mode 'direct' needs a pinned worker "
                "(nvext.backend_instance_id or the x-worker-instance-id header)",
                param="worker_id",
            )
        allowed = gen.routing.allowed_worker_ids if gen.routing is not None else None
        if allowed is not None:
            fleet = Fleet.of(allowed_workers(fleet.cards, allowed))
        if not fleet:
            among = " among nvext.allowed_worker_ids" if allowed is not None else ""
            raise NoWorkerAvailable(
                f"no live worker serves model {gen.model}{among}", retry_after_s=1.0
            )
        return fleet

    def _is_busy(self, card: WorkerCard, now: float) -> bool:
        thresholds = self.settings.busy
        if not thresholds.enabled:
            return False
        return is_busy(
            thresholds,
            report=self.reports.fresh(card.worker_id, now),
            tracked_prefill_tokens=self.load.prefill_tokens(card.worker_id),
            kv_total_blocks=card.kv_blocks,
        )

    def _choose(
        self,
        gen: Generate,
        cards: Sequence[WorkerCard],
        candidates: Sequence[Candidate],
        hints: RoutingHints,
        rng: random.Random,
    ) -> int:
        if gen.worker_id is not None:
            return 0
        eligible = [i for i, c in enumerate(candidates) if not c.busy]
        if not eligible:
            error = AllWorkersOverloaded if self.settings.busy_status == 529 else AllWorkersBusy
            raise error(
                f"all {len(candidates)} workers of model {gen.model} are busy",
                retry_after_s=self.settings.busy_retry_after_s,
            )
        if not self.is_kv:
            assert self._policy is not None
            card = self._policy.choose(gen, [cards[i] for i in eligible])
            return next(i for i in eligible if cards[i].worker_id == card.worker_id)
        costs = [candidates[i].cost for i in eligible]
        return eligible[pick(costs, self._temperature(hints), rng)]

    def _temperature(self, hints: RoutingHints) -> float:
        """The request's router temperature, else the router's."""
        temperature = hints.router_temperature
        return self.settings.temperature if temperature is None else temperature

    def _estimate_eventless(
        self, eventless: Sequence[str], hashes: Sequence[int], overlaps: dict[str, int]
    ) -> dict[str, int]:
        """Overlaps of workers without KV events, from the approximate index."""
        self.eventless.update(eventless)
        guessed = self.approx.index.find_matches(hashes)
        merged = dict(overlaps)
        for worker_id in eventless:
            merged[worker_id] = guessed.get(worker_id, 0)
        return merged

    # --- shared state --------------------------------------------------------------------------
    def commit(self, decision: RouteDecision, now: float) -> None:
        """Count a decision (this replica's or a peer's) in the active load."""
        self.load.add(
            decision.request_id,
            decision.worker_id,
            block_hashes=decision.block_hashes,
            prompt_blocks=decision.prompt_blocks,
            prefill_tokens=decision.prefill_tokens,
            now=now,
        )
        if self.uses_approx or decision.worker_id in self.eventless:
            self.approx.remember(decision.worker_id, decision.block_hashes, now)

    def on_phase(self, phase: RequestPhase) -> None:
        """A worker's lifecycle event: prefill done, or finished."""
        if phase.phase == "prefill_done":
            self.load.prefill_done(phase.request_id)
        else:
            self.load.free(phase.request_id)

    def on_cancel(self, request_id: str) -> None:
        self.load.free(request_id)

    def on_load(self, report: WorkerLoad, now: float) -> None:
        self.reports.update(report, now)

    def remove_worker(self, worker_id: str) -> bool:
        """Forget everything about a worker that left the registry; True if it was known."""
        known = self.sync.remove_worker(worker_id)
        known = self.approx.remove_worker(worker_id) or known
        self.eventless.discard(worker_id)
        known = self.load.remove_worker(worker_id) > 0 or known
        self.reports.remove_worker(worker_id)
        return known

    def known_workers(self) -> set[str]:
        """Workers with any state here (index, approximate index or active load)."""
        return self.sync.workers() | set(self.approx.index.workers()) | set(self.load.workers())

    def sweep(self, now: float) -> tuple[int, int]:
        """Expire stale requests and (approximate mode) old assumed blocks."""
        stale = len(self.load.expire(now))
        dropped = self.approx.expire(now) if self.uses_approx or self.eventless else 0
        return stale, dropped
