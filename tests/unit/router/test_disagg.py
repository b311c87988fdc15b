"""Two-phase routing (issue 24): roles, data-parallel ranks, pins, conditional disaggregation.

The property test at the end checks the core's two-phase choice against an exhaustive
computation written here from the cost model's definition (``selection.worker_cost`` over every
target of each pool), on random fleets, caches and loads.
"""

from __future__ import annotations

import random

import pytest

from services.router.core import CoreSettings, RoutingCore
from shared.errors import InvalidRequest, NoWorkerAvailable
from shared.hashing import prefix_hashes
from shared.messages import (
    BlockStored,
    Generate,
    KvEventBatch,
    KvTransfer,
    RequestPhase,
    RoutingHints,
    SamplingParams,
    WorkerCard,
    WorkerLoad,
)
from shared.targets import split_target, target_id

BS = 16
PROMPT = tuple(range(7000, 7000 + BS * 40))  # 40 full blocks
HASHES = prefix_hashes(PROMPT, BS)


def _gen(rid: str = "r1", tokens: tuple[int, ...] = PROMPT, **kw: object) -> Generate:
    kw.setdefault("sampling", SamplingParams(max_tokens=8))
    return Generate(
        request_id=rid,
        model="m",
        token_ids=tokens,
        stream_to="s",
        **kw,  # type: ignore[arg-type]
    )


def _card(worker_id: str, role: str = "both", dp: int = 1, model: str = "m") -> WorkerCard:
    return WorkerCard(
        worker_id=worker_id, model=model, block_size=BS, kv_blocks=4096, role=role, dp_size=dp
    )  # type: ignore[arg-type]


def _fleet(prefill: int = 2, decode: int = 2, dp: int = 1) -> list[WorkerCard]:
    return [_card(f"p{i}", "prefill", dp) for i in range(prefill)] + [
        _card(f"d{i}", "decode", dp) for i in range(decode)
    ]


def _core(mode: str = "kv", **kw: object) -> RoutingCore:
    return RoutingCore(CoreSettings(mode=mode, **kw))  # type: ignore[arg-type]


RNG = random.Random(0)


class TestRoles:
    def test_aggregated_fleet_is_untouched(self) -> None:
        decision = _core().decide(_gen(), [_card("w1"), _card("w2")], now=0, rng=RNG)
        assert (decision.disagg, decision.prefill_worker_id) == ("", "")

    def test_prefill_goes_where_the_prefix_is_and_decode_to_a_decode_worker(self) -> None:
        core = _core()
        core.sync.index.store("p1", HASHES)
        decision = core.decide(_gen(), _fleet(), now=0, rng=RNG)
        assert decision.disagg == "remote"
        assert decision.prefill_worker_id == "p1"
        assert decision.prefill_overlap_blocks == 40
        assert decision.worker_id in ("d0", "d1")
        assert {c.worker_id for c in decision.prefill_candidates} == {"p0", "p1"}
        assert {c.worker_id for c in decision.candidates} == {"d0", "d1"}

    def test_load_is_counted_on_both_phases_and_freed_per_phase(self) -> None:
        core = _core()
        decision = core.decide(_gen(), _fleet(), now=0, rng=RNG)
        core.commit(decision, 0)
        prefill, decode = decision.prefill_worker_id, decision.worker_id
        assert core.load.prefill_tokens(prefill) == len(PROMPT)
        assert core.load.prefill_tokens(decode) == 0  # it pulls, it does not prefill
        assert core.load.decode_blocks(decode) == 40
        assert core.load.prefill_worker_of("r1") == prefill
        # The prefill worker's "finished" ends the prefill phase only.
        core.on_phase(RequestPhase(request_id="r1", worker_id=prefill, phase="finished"))
        assert core.load.requests(prefill) == 0
        assert core.load.worker_of("r1") == decode
        core.on_phase(RequestPhase(request_id="r1", worker_id=decode, phase="finished"))
        assert "r1" not in core.load

    def test_reports_end_each_phase_only_on_its_own_worker(self) -> None:
        core = _core()
        decision = core.decide(_gen(), _fleet(), now=0, rng=RNG)
        core.commit(decision, 0)
        prefill, decode = decision.prefill_worker_id, decision.worker_id
        # The decode worker has not seen the request while its prefill runs elsewhere.
        assert core.on_load(WorkerLoad(worker_id=decode), now=10) == []
        assert core.load.prefill_worker_of("r1") == prefill
        # The prefill worker's report ends the prefill phase (its "finished" was lost) ...
        assert core.on_load(WorkerLoad(worker_id=prefill), now=10) == ["r1"]
        assert core.load.prefill_worker_of("r1") is None
        assert core.load.worker_of("r1") == decode
        # ... and then the decode worker's report weighs the decode phase.
        assert core.on_load(WorkerLoad(worker_id=decode, active=1), now=11) == []
        assert core.on_load(WorkerLoad(worker_id=decode), now=12) == ["r1"]
        assert "r1" not in core.load

    def test_a_lost_prefill_worker_names_no_request_to_migrate(self) -> None:
        core = _core()
        core.sync.index.store("p0", HASHES)
        decision = core.decide(_gen(), _fleet(), now=0, rng=RNG)
        core.commit(decision, 0)
        assert core.load.requests_on("p0") == []
        assert core.load.requests_on(decision.worker_id) == ["r1"]

    def test_no_prefill_worker_falls_back_to_aggregated(self) -> None:
        decision = _core().decide(_gen(), _fleet(prefill=0), now=0, rng=RNG)
        assert (decision.disagg, decision.prefill_worker_id) == ("fallback", "")

    def test_enforced_disaggregation_without_prefill_worker_is_503(self) -> None:
        with pytest.raises(NoWorkerAvailable, match="enforce-disagg"):
            _core(enforce_disagg=True).decide(_gen(), _fleet(prefill=0), now=0, rng=RNG)

    def test_prefill_workers_without_decode_workers_is_503(self) -> None:
        with pytest.raises(NoWorkerAvailable, match="decode"):
            _core().decide(_gen(), _fleet(decode=0), now=0, rng=RNG)

    def test_a_decode_phase_routed_again_gets_no_new_prefill(self) -> None:
        transfer = KvTransfer(source_worker_id="p1")
        decision = _core().decide(_gen(kv_transfer=transfer), _fleet(), now=0, rng=RNG)
        assert (decision.disagg, decision.prefill_worker_id, decision.prefill_tokens) == (
            "remote",
            "p1",
            0,
        )

    @pytest.mark.parametrize("mode", ["round-robin", "random"])
    def test_other_modes_route_both_phases(self, mode: str) -> None:
        core = _core(mode, seed=3)
        seen = set()
        for i in range(8):
            decision = core.decide(_gen(f"r{i}"), _fleet(), now=0, rng=RNG)
            assert decision.prefill_worker_id.startswith("p")
            assert decision.worker_id.startswith("d")
            seen.add((decision.prefill_worker_id, decision.worker_id))
        assert len(seen) > 1


class TestConditional:
    def test_short_prompt_stays_on_the_decode_worker(self) -> None:
        core = _core(conditional_disagg=True, disagg_min_tokens=512)
        decision = core.decide(_gen(tokens=PROMPT[:100]), _fleet(), now=0, rng=RNG)
        assert (decision.disagg, decision.prefill_worker_id) == ("local", "")

    def test_long_prompt_goes_to_a_prefill_worker(self) -> None:
        core = _core(conditional_disagg=True, disagg_min_tokens=512)
        decision = core.decide(_gen(), _fleet(), now=0, rng=RNG)
        assert decision.disagg == "remote"

    def test_decode_worker_holding_most_of_the_prompt_prefills_it(self) -> None:
        core = _core(conditional_disagg=True, disagg_min_tokens=64, disagg_local_overlap=0.5)
        core.sync.index.store("d1", HASHES[:30])  # 30 of 40 blocks: 160 tokens uncached
        decision = core.decide(_gen(), _fleet(), now=0, rng=RNG)
        assert (decision.worker_id, decision.disagg) == ("d1", "local")

    def test_without_the_flag_every_prompt_goes_remote(self) -> None:
        decision = _core().decide(_gen(tokens=PROMPT[:20]), _fleet(), now=0, rng=RNG)
        assert decision.disagg == "remote"


class TestDataParallel:
    def test_each_rank_is_a_target_with_its_own_cache(self) -> None:
        core = _core()
        batch = KvEventBatch(
            worker_id="w",
            event_id=1,
            events=(BlockStored(block_hashes=tuple(HASHES), block_size=BS, dp_rank=2),),
        )
        core.sync.on_batch(batch)
        decision = core.decide(_gen(), [_card("w", dp=4)], now=0, rng=RNG)
        assert (decision.worker_id, decision.dp_rank, decision.overlap_blocks) == ("w", 2, 40)
        assert {c.worker_id for c in decision.candidates} == {"w", "w#1", "w#2", "w#3"}

    def test_load_spreads_over_ranks(self) -> None:
        core = _core()
        ranks = set()
        for i in range(4):
            tokens = tuple(range(i * 10_000, i * 10_000 + 64))
            decision = core.decide(_gen(f"r{i}", tokens), [_card("w", dp=4)], now=0, rng=RNG)
            core.commit(decision, 0)
            ranks.add(decision.dp_rank)
        assert ranks == {0, 1, 2, 3}

    def test_a_workers_report_weighs_all_its_ranks_together(self) -> None:
        core = _core()
        for i in range(4):
            tokens = tuple(range(i * 10_000, i * 10_000 + 64))
            core.commit(core.decide(_gen(f"r{i}", tokens), [_card("w", dp=4)], now=i, rng=RNG), i)
        assert core.on_load(WorkerLoad(worker_id="w", active=3, waiting=1), now=10) == []
        assert core.on_load(WorkerLoad(worker_id="w", active=2), now=10) == ["r0", "r1"]
        assert sum(core.load.requests(t) for t in ("w", "w#1", "w#2", "w#3")) == 2

    def test_removing_a_worker_removes_all_its_ranks(self) -> None:
        core = _core()
        core.sync.index.store("w#3", HASHES)
        decision = core.decide(_gen(), [_card("w", dp=4)], now=0, rng=RNG)
        core.commit(decision, 0)
        assert core.known_workers() == {"w"}
        assert core.remove_worker("w")
        assert core.known_workers() == set()
        assert core.sync.index.workers() == []


class TestPins:
    def test_pins_are_honoured_per_phase(self) -> None:
        hints = RoutingHints(prefill_worker_id="p0", prefill_dp_rank=1, dp_rank=1)
        decision = _core().decide(_gen(worker_id="d1", routing=hints), _fleet(dp=2), now=0, rng=RNG)
        assert (decision.prefill_worker_id, decision.prefill_dp_rank) == ("p0", 1)
        assert (decision.worker_id, decision.dp_rank) == ("d1", 1)

    def test_prefill_pin_forces_remote_even_for_a_short_prompt(self) -> None:
        core = _core(conditional_disagg=True)
        hints = RoutingHints(prefill_worker_id="p1")
        decision = core.decide(_gen(tokens=PROMPT[:20], routing=hints), _fleet(), now=0, rng=RNG)
        assert (decision.disagg, decision.prefill_worker_id) == ("remote", "p1")

    @pytest.mark.parametrize(
        ("worker_id", "hints", "param", "message"),
        [
            ("zz", RoutingHints(), "nvext.backend_instance_id", "not a known worker"),
            (
                "p0",
                RoutingHints(decode_worker_id_param="nvext.decode_worker_id"),
                "nvext.decode_worker_id",
                "is a prefill worker",
            ),
            ("d0", RoutingHints(dp_rank=2), "nvext.dp_rank", "out of range"),
            (None, RoutingHints(dp_rank=0), "nvext.dp_rank", "pin the worker"),
            (None, RoutingHints(prefill_worker_id="d0"), "nvext.prefill_worker_id", "not a pre"),
            (None, RoutingHints(prefill_worker_id="zz"), "nvext.prefill_worker_id", "not a known"),
            (
                None,
                RoutingHints(prefill_worker_id="p0", prefill_dp_rank=5),
                "nvext.prefill_dp_rank",
                "out of range",
            ),
            (None, RoutingHints(prefill_dp_rank=0), "nvext.prefill_dp_rank", "set"),
        ],
    )
    def test_bad_pins_are_400_naming_the_field(
        self, worker_id: str | None, hints: RoutingHints, param: str, message: str
    ) -> None:
        with pytest.raises(InvalidRequest, match=message) as caught:
            _core().decide(_gen(worker_id=worker_id, routing=hints), _fleet(dp=2), now=0, rng=RNG)
        assert caught.value.param == param

    def test_a_worker_of_another_model_is_400(self) -> None:
        other = _card("x", model="other")
        with pytest.raises(InvalidRequest, match="serves model other") as caught:
            _core().decide(_gen(worker_id="x"), _fleet(), now=0, rng=RNG, known={"x": other}.get)
        assert caught.value.param == "nvext.backend_instance_id"

    def test_a_dead_pinned_prefill_worker_is_503_with_retry_after(self) -> None:
        dead = _card("p9", "prefill")
        hints = RoutingHints(prefill_worker_id="p9")
        with pytest.raises(NoWorkerAvailable, match="p9 is not live") as caught:
            _core().decide(_gen(routing=hints), _fleet(), now=0, rng=RNG, known={"p9": dead}.get)
        assert caught.value.status == 503
        assert caught.value.retry_after_s


# --- property: the two-phase choice equals an exhaustive computation ----------------------------


def _exhaustive(
    core: RoutingCore, gen: Generate, cards: list[WorkerCard], weight: float
) -> tuple[set[str], set[str] | None]:
    """The minimum-cost decode targets and prefill targets (None: local or no prefill), from
    the cost model's definition, scoring every target of each pool."""
    from services.router.selection import worker_cost

    targets = [(target_id(c.worker_id, r), c.role) for c in cards for r in range(max(1, c.dp_size))]
    hashes = prefix_hashes(gen.token_ids, BS)
    matches = core.sync.index.find_matches(hashes)
    prompt = len(gen.token_ids)
    tail = -(-prompt // BS) - len(hashes)

    def cost(target: str) -> float:
        prefill, decode, new = core.load.figures(target, hashes)
        cached = matches.get(target, 0)
        pending = max(0, len(hashes) - new - cached)  # in-flight overlap (the default)
        prefill = max(0, prefill - pending * BS)
        return worker_cost(
            target, cached + pending, prefill, decode, new + tail, prompt, BS, weight
        ).cost

    def best(pool: list[str]) -> set[str]:
        costs = {t: cost(t) for t in pool}
        low = min(costs.values())
        return {t for t, c in costs.items() if c == low}

    decode = best([t for t, role in targets if role != "prefill"])
    prefill_pool = [t for t, role in targets if role == "prefill"]
    if not prefill_pool:
        return decode, None
    return decode, best(prefill_pool)


@pytest.mark.parametrize("seed", range(60))
def test_two_phase_choice_equals_exhaustive_computation(seed: int) -> None:
    rng = random.Random(seed)
    weight = rng.choice([0.5, 1.0, 2.0])
    core = _core(overlap_weight=weight, seed=seed)
    big = seed % 3 == 0  # pools beyond 32 targets: the sparse computation's path
    cards = [
        _card(f"p{i}", "prefill", rng.choice([1, 1, 2]))
        for i in range(rng.randint(20, 30) if big else rng.randint(0, 4))
    ] + [
        _card(f"d{i}", rng.choice(["decode", "both"]), rng.choice([1, 2, 3]))
        for i in range(rng.randint(15, 25) if big else rng.randint(1, 5))
    ]
    targets = [target_id(c.worker_id, r) for c in cards for r in range(c.dp_size)]
    for target in targets:  # random caches: a random prefix of the prompt
        depth = rng.choice([0, 0, 5, 10, 20, 40])
        if depth:
            core.sync.index.store(target, HASHES[:depth])
    for i in range(rng.randint(0, 12)):  # random load: earlier requests, some sharing a prefix
        head = rng.choice([0, 8, 40])
        tokens = PROMPT[: head * BS] + tuple(range(90_000 + i * 1000, 90_000 + i * 1000 + 200))
        earlier = core.decide(_gen(f"old{i}", tokens), cards, now=0, rng=rng)
        core.commit(earlier, 0)
    gen = _gen("new", PROMPT[: rng.choice([10, 40]) * BS + rng.randint(0, 15)])
    decode_best, prefill_best = _exhaustive(core, gen, cards, weight)
    for decide in (core.decide, core.decide_exhaustive):
        decision = decide(gen, cards, now=0, rng=random.Random(seed))
        assert target_id(decision.worker_id, decision.dp_rank) in decode_best
        if prefill_best is None:
            assert decision.disagg in ("", "fallback")
        else:
            chosen = target_id(decision.prefill_worker_id, decision.prefill_dp_rank)
            assert decision.disagg == "remote"
            assert chosen in prefill_best
            assert split_target(chosen)[0].startswith("p")


def test_several_sequences_prefill_on_the_decode_worker() -> None:
    """n > 1: each sequence of a vLLM decode instance would pull the same blocks."""
    gen = _gen(sampling=SamplingParams(max_tokens=8, n=2))
    decision = _core().decide(gen, _fleet(), now=0, rng=RNG)
    assert (decision.disagg, decision.prefill_worker_id) == ("local", "")
