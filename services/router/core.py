"""The router's decision core: live workers + KV index + active load -> one ``RouteDecision``.

Workers are routing targets here (``shared.targets``: each data-parallel rank is one). For a
disaggregated model (workers with roles, ``fleet.py``) a decision has two phases, made with the
same cost model on two pools: the decode target among the decode workers (by decode load and its
own overlap), then, unless conditional disaggregation keeps the prefill local, the prefill target
among the prefill workers (by KV overlap and prefill load). Both go into one ``RouteDecision``.

Pure: no I/O; the clock (``now``) and the random generator come in as arguments, so replicas
that saw the same events and decisions, given the same generator, decide the same way. The
wiring (``service.py``) feeds it KV events (through ``KvSync``), peers' decisions, lifecycle
events, cancels and load reports, and publishes what ``decide`` returns.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from services.router.approx import ApproxIndex
from services.router.fleet import Fleet, FleetCache
from services.router.load import ActiveLoad, BusyThresholds, WorkerReports, is_busy
from services.router.lora_placement import holders
from services.router.pins import KnownCard
from services.router.pins import resolve as resolve_pins
from services.router.policy import Policy, build_policy
from services.router.scoring import Scorer, choose_sparse
from services.router.selection import allowed_workers, pick
from services.router.sync import KvSync
from shared.errors import (
    AllWorkersBusy,
    AllWorkersOverloaded,
    InvalidRequest,
    NoWorkerAvailable,
)
from shared.hashing import extend_prefix_hashes, prefix_hashes
from shared.images import mm_spans
from shared.messages import (
    Candidate,
    Generate,
    RequestPhase,
    RouteDecision,
    RoutingHints,
    WorkerCard,
    WorkerLoad,
)
from shared.targets import split_target, target_id, worker_of

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
    conditional_disagg: bool = False
    """Prefill on the decode worker when it would compute fewer than ``disagg_min_tokens``
    uncached tokens or holds at least ``disagg_local_overlap`` of the prompt's blocks."""
    disagg_min_tokens: int = 512
    disagg_local_overlap: float = 0.5
    enforce_disagg: bool = False
    """No live prefill worker: 503 instead of aggregated serving on a decode worker."""


def _unknown(_: str) -> WorkerCard | None:
    return None


def _session_cards(fleet: Fleet, target: str) -> tuple[WorkerCard, ...]:
    """The card of a session's bound target in ``fleet`` (empty: not there)."""
    index = fleet.position.get(target)
    return () if index is None else (fleet.cards[index],)


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
        self.busy_by_model: Mapping[str, BusyThresholds] = {}
        """Thresholds set at run time per model (``thresholds.py``), over ``settings.busy``."""
        if policy is None and settings.mode in ("round-robin", "random"):
            self._policy = build_policy(settings.mode, seed=settings.seed)

    @property
    def uses_approx(self) -> bool:
        return self.is_kv and not self.settings.use_kv_events

    # --- deciding ------------------------------------------------------------------------------
    def decide(
        self,
        gen: Generate,
        live: Sequence[WorkerCard],
        *,
        now: float,
        rng: random.Random,
        known: KnownCard = _unknown,
        session_target: str | None = None,
    ) -> RouteDecision:
        """Where ``gen`` goes among the ``live`` workers of its model; changes no state.

        In kv mode beyond ``LIST_ALL_UP_TO`` workers, at temperature 0 with the busy checks off
        (the defaults), only the workers with state (an overlap, requests in flight) are scored
        one by one and the idle rest once (``scoring.choose_sparse``): the same choice as
        ``decide_exhaustive``, at a cost that grows with the workers that hold something of the
        request, not with the fleet.

        ``known`` gives a worker's card whatever its state, so that a pin to a worker that is
        not live tells "unknown" (400) from "dead" (503) (``pins.py``).

        ``session_target``: the (decode or aggregated) target a session is bound to
        (``sessions.py``): the choice is made among it alone, busy checks and mode as for any
        request; ignored under a pin or when it is not in the fleet.

        Raises:
            InvalidRequest: a bad pin (``pins.py``), or ``direct`` mode without one (400).
            NoWorkerAvailable: no live worker serves the model, a pinned worker is not live, or
                no prefill worker lives under ``enforce_disagg`` (503).
            AllWorkersBusy: every live worker is over a busy threshold (503 or 529).
        """
        return self._two_phase(gen, live, now, rng, known, session_target, exhaustive=False)

    def decide_exhaustive(
        self,
        gen: Generate,
        live: Sequence[WorkerCard],
        *,
        now: float,
        rng: random.Random,
        known: KnownCard = _unknown,
        session_target: str | None = None,
    ) -> RouteDecision:
        """``decide`` with every worker scored one by one, whatever the settings: the
        straightforward computation that the sparse one must agree with."""
        return self._two_phase(gen, live, now, rng, known, session_target, exhaustive=True)

    def _two_phase(
        self,
        gen: Generate,
        live: Sequence[WorkerCard],
        now: float,
        rng: random.Random,
        known: KnownCard,
        session_target: str | None,
        *,
        exhaustive: bool,
    ) -> RouteDecision:
        fleet = self._fleet(gen, live)
        pins = resolve_pins(gen, fleet, known)
        hints = gen.routing or _NO_HINTS
        bound = None
        if session_target is not None and pins.decode is None:
            bound = _session_cards(fleet.decode or fleet, session_target)
        if not fleet.is_disaggregated:
            pool = fleet if pins.decode is None else fleet.subset(pins.decode)
            if bound:
                pool = fleet.subset(bound)
            return self._pool(gen, pool, hints, now, rng, pins.decode, exhaustive)
        assert fleet.decode is not None
        assert fleet.prefill is not None
        decode = fleet.decode if pins.decode is None else fleet.subset(pins.decode)
        if bound:
            decode = fleet.subset(bound)
        if not decode:
            raise NoWorkerAvailable(
                f"no live decode worker serves model {gen.model}", retry_after_s=1.0
            )
        chosen = self._pool(gen, decode, hints, now, rng, pins.decode, exhaustive)
        transfer = gen.kv_transfer
        if transfer is not None:  # its prefill is done: only the decode phase is routed again
            return msgspec.structs.replace(
                chosen,
                prefill_worker_id=transfer.source_worker_id,
                prefill_dp_rank=transfer.source_dp_rank,
                prefill_tokens=0,
                disagg="remote",
            )
        prefill = fleet.prefill if pins.prefill is None else fleet.subset(pins.prefill)
        if not prefill:
            if self.settings.enforce_disagg:
                raise NoWorkerAvailable(
                    f"no live prefill worker serves model {gen.model} and disaggregation is "
                    "enforced (--enforce-disagg)",
                    retry_after_s=1.0,
                )
            return msgspec.structs.replace(chosen, disagg="fallback")
        if pins.prefill is None and (gen.sampling.n > 1 or self._keeps_local(chosen)):
            # n > 1: a vLLM decode instance would pull the same blocks once per sequence
            return msgspec.structs.replace(chosen, disagg="local")
        first = self._pool(gen, prefill, hints, now, rng, pins.prefill, exhaustive)
        return msgspec.structs.replace(
            chosen,
            prefill_worker_id=first.worker_id,
            prefill_dp_rank=first.dp_rank,
            prefill_overlap_blocks=first.overlap_blocks,
            prefill_tokens=first.prefill_tokens,
            prefill_candidates=first.candidates,
            disagg="remote",
        )

    def _keeps_local(self, chosen: RouteDecision) -> bool:
        """Conditional disaggregation: the decode worker prefills this prompt itself."""
        settings = self.settings
        if self.settings.mode == "direct":
            return True  # an external picker named the decode worker and no prefill worker
        if not settings.conditional_disagg:
            return False
        if chosen.prefill_tokens < settings.disagg_min_tokens:
            return True
        blocks = chosen.prompt_blocks
        return blocks > 0 and chosen.overlap_blocks >= settings.disagg_local_overlap * blocks

    def _pool(
        self,
        gen: Generate,
        fleet: Fleet,
        hints: RoutingHints,
        now: float,
        rng: random.Random,
        pinned: tuple[WorkerCard, ...] | None,
        exhaustive: bool,
    ) -> RouteDecision:
        """The decision among one pool of targets (one phase)."""
        sparse = (
            not exhaustive
            and self.is_kv
            and len(fleet) > LIST_ALL_UP_TO
            and (self.uses_approx or not fleet.eventless)
            and pinned is None
            and not self.busy_of(gen.model).enabled
            and self._temperature(hints) <= 0.0
        )
        decision = self._decide(gen, fleet, hints, now, rng, sparse=sparse, pinned=pinned)
        worker_id, rank = split_target(decision.worker_id)
        if rank:
            decision = msgspec.structs.replace(decision, worker_id=worker_id, dp_rank=rank)
        return decision

    def _decide(
        self,
        gen: Generate,
        fleet: Fleet,
        hints: RoutingHints,
        now: float,
        rng: random.Random,
        *,
        sparse: bool,
        pinned: tuple[WorkerCard, ...] | None = None,
    ) -> RouteDecision:
        is_pinned = pinned is not None
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
        elif self._policy is not None and not is_pinned and not self.busy_of(gen.model).enabled:
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
            check_busy = not is_pinned and self.busy_of(gen.model).enabled
            candidates = [
                scorer.score(c.worker_id, check_busy and self._is_busy(c, now)) for c in cards
            ]
            best = candidates[self._choose(gen, cards, candidates, hints, rng)]
        return RouteDecision(
            request_id=gen.request_id,
            router_id=self.settings.router_id,
            worker_id=best.worker_id,
            model=gen.model,
            mode="direct" if is_pinned else self.mode_label,
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
            policy_class=hints.policy_class or "",
            output_blocks=-(-hints.osl // block_size) if hints.osl else 0,
            tenant=hints.tenant or "",
            lora_name=hints.lora_name or "",
        )

    @staticmethod
    def _hashes(gen: Generate, block_size: int, hints: RoutingHints) -> Sequence[int]:
        """The prompt's block hashes: the preprocessor's when they are at this block size
        (extended over tokens appended since, as a migrated request's), else hashed here."""
        lora, salt = hints.lora_name, hints.cache_salt
        images = mm_spans(gen.images)  # decision 032: image hashes in their blocks' hashes
        if gen.hash_block_size == block_size and gen.block_hashes:
            return extend_prefix_hashes(
                gen.token_ids,
                block_size,
                gen.block_hashes,
                lora_name=lora,
                cache_salt=salt,
                images=images,
            )
        return prefix_hashes(
            gen.token_ids, block_size, lora_name=lora, cache_salt=salt, images=images
        )

    @property
    def mode_label(self) -> str:
        """The mode as decisions and metrics name it (``kv-approx`` without KV events)."""
        return "kv-approx" if self.uses_approx else self.settings.mode

    def _fleet(self, gen: Generate, live: Sequence[WorkerCard]) -> Fleet:
        """The workers ``gen`` may go to (raises when there are none)."""
        fleet = self._fleets.get(gen.model, live)
        if gen.worker_id is not None:
            return fleet  # ``pins.resolve`` narrows it (or says why it cannot)
        if self.settings.mode == "direct":
            raise InvalidRequest(
                "router mode 'direct' needs a pinned worker "
                "(nvext.backend_instance_id or the x-worker-instance-id header)",
                param="worker_id",
            )
        allowed = gen.routing.allowed_worker_ids if gen.routing is not None else None
        if allowed is not None:
            fleet = fleet.subset(allowed_workers(fleet.cards, allowed))
        lora = gen.routing.lora_name if gen.routing is not None else None
        if lora and fleet:
            fleet = fleet.subset(holders(fleet.cards, lora))
            if not fleet:
                raise NoWorkerAvailable(
                    f"no live worker of model {gen.model} holds LoRA adapter {lora}",
                    retry_after_s=1.0,
                )
        if not fleet:
            among = " among nvext.allowed_worker_ids" if allowed is not None else ""
            raise NoWorkerAvailable(
                f"no live worker serves model {gen.model}{among}", retry_after_s=1.0
            )
        return fleet

    def is_busy(self, card: WorkerCard, now: float) -> bool:
        """Whether a target (its card) is over a busy threshold now (False with none set)."""
        return self._is_busy(card, now)

    def busy_of(self, model: str) -> BusyThresholds:
        """The model's busy thresholds: set at run time, else the router's settings."""
        return self.busy_by_model.get(model, self.settings.busy)

    def _is_busy(self, card: WorkerCard, now: float) -> bool:
        thresholds = self.busy_of(card.model)
        if not thresholds.enabled:
            return False
        return is_busy(
            thresholds,
            report=self.reports.fresh(worker_of(card.worker_id), now),
            tracked_prefill_tokens=self.load.prefill_tokens(card.worker_id),
            kv_total_blocks=card.kv_blocks,
            kv_capacity_tokens=card.kv_blocks * card.block_size,
        )

    def _choose(
        self,
        gen: Generate,
        cards: Sequence[WorkerCard],
        candidates: Sequence[Candidate],
        hints: RoutingHints,
        rng: random.Random,
    ) -> int:
        if gen.worker_id is not None and len(candidates) == 1:
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
        """Count a decision (this replica's or a peer's) in the active load: a disaggregated
        one on its decode target (which prefills nothing) and its prefill target."""
        target = target_id(decision.worker_id, decision.dp_rank)
        remote = decision.disagg == "remote"
        self.load.add(
            decision.request_id,
            target,
            block_hashes=decision.block_hashes,
            prompt_blocks=decision.prompt_blocks + decision.output_blocks,
            prefill_tokens=0 if remote else decision.prefill_tokens,
            now=now,
        )
        if remote and decision.prefill_tokens and decision.prefill_worker_id:
            self.load.add_prefill(
                decision.request_id,
                target_id(decision.prefill_worker_id, decision.prefill_dp_rank),
                block_hashes=decision.block_hashes,
                prompt_blocks=decision.prompt_blocks,
                prefill_tokens=decision.prefill_tokens,
                now=now,
            )
        if self.uses_approx or target in self.eventless:
            self.approx.remember(target, decision.block_hashes, now)

    def on_phase(self, phase: RequestPhase) -> None:
        """A worker's lifecycle event: prefill done, or finished (a prefill worker's
        ``finished`` ends only the prefill phase of a disaggregated request)."""
        if phase.phase == "prefill_done":
            self.load.prefill_done(phase.request_id, phase.worker_id)
        elif not self.load.prefill_finished(phase.request_id, phase.worker_id):
            self.load.free(phase.request_id)

    def on_cancel(self, request_id: str) -> None:
        self.load.free(request_id)

    def on_load(self, report: WorkerLoad, now: float) -> list[str]:
        """Keep the worker's report and settle its count with it; returns the requests ended
        (their end was never heard here: ``ActiveLoad.settle``)."""
        self.reports.update(report, now)
        return self.load.settle(report.worker_id, report.active + report.waiting, now)

    def remove_worker(self, worker_id: str) -> bool:
        """Forget everything about a worker (all its ranks) that left the registry; True if it
        was known."""
        known = self.sync.remove_worker(worker_id)
        for target in [t for t in self.approx.index.workers() if worker_of(t) == worker_id]:
            known = self.approx.remove_worker(target) or known
            self.eventless.discard(target)
        self.eventless.discard(worker_id)
        known = self.load.remove_worker(worker_id) > 0 or known
        self.reports.remove_worker(worker_id)
        return known

    def known_workers(self) -> set[str]:
        """Workers with any state here (index, approximate index or active load)."""
        targets = set(self.approx.index.workers()) | set(self.load.workers())
        return self.sync.workers() | {worker_of(t) for t in targets}

    def sweep(self, now: float) -> tuple[int, int]:
        """Expire stale requests and (approximate mode) old assumed blocks."""
        stale = len(self.load.expire(now))
        dropped = self.approx.expire(now) if self.uses_approx or self.eventless else 0
        return stale, dropped
