"""The decision core: kv routing, load accounting, busy filtering, pinning, approximate mode."""

from __future__ import annotations

import random

import pytest

from services.router.core import CoreSettings, RoutingCore
from services.router.load import BusyThresholds
from shared.errors import AllWorkersBusy, InvalidRequest, NoWorkerAvailable
from shared.hashing import prefix_hashes
from shared.messages import (
    Generate,
    LoraAdapter,
    RequestPhase,
    RoutingHints,
    SamplingParams,
    WorkerCard,
    WorkerLoad,
)

PREFIX = tuple(range(5000, 5000 + 16 * 8))  # 8 full blocks


def _gen(rid: str = "r1", tokens: tuple[int, ...] = PREFIX, **kw: object) -> Generate:
    return Generate(
        request_id=rid,
        model="m",
        token_ids=tokens,
        sampling=SamplingParams(),
        stream_to="s",
        **kw,  # type: ignore[arg-type]
    )


def _cards(*ids: str, kv_blocks: int = 1000) -> list[WorkerCard]:
    return [WorkerCard(worker_id=i, model="m", block_size=16, kv_blocks=kv_blocks) for i in ids]


def _core(**kw: object) -> RoutingCore:
    return RoutingCore(CoreSettings(mode="kv", **kw))  # type: ignore[arg-type]


RNG = random.Random(0)


class TestKvRouting:
    def test_request_goes_to_the_worker_holding_its_prefix(self) -> None:
        core = _core()
        core.sync.index.store("w2", prefix_hashes(PREFIX, 16))
        decision = core.decide(_gen(), _cards("w1", "w2", "w3"), now=0, rng=RNG)
        assert (decision.worker_id, decision.overlap_blocks, decision.prefill_tokens) == (
            "w2",
            8,
            0,
        )
        assert decision.mode == "kv"
        assert [c.worker_id for c in decision.candidates] == ["w1", "w2", "w3"]

    def test_hashes_made_upstream_are_used_and_extended_not_trusted_blindly(self) -> None:
        core = _core()
        salt = RoutingHints(cache_salt="t")
        core.sync.index.store("w2", prefix_hashes(PREFIX, 16, cache_salt="t"))
        cards = _cards("w1", "w2", "w3")
        # The preprocessor's hashes, of the whole prompt or of a prefix of it (a migration
        # appended tokens); at another block size they are ignored and the router hashes.
        for known, size in (
            (prefix_hashes(PREFIX, 16, cache_salt="t"), 16),
            (prefix_hashes(PREFIX[:40], 16, cache_salt="t"), 16),
            (prefix_hashes(PREFIX, 8, cache_salt="t"), 8),
        ):
            gen = _gen(routing=salt, block_hashes=tuple(known), hash_block_size=size)
            decision = core.decide(gen, cards, now=0, rng=RNG)
            assert (decision.worker_id, decision.overlap_blocks) == ("w2", 8)
            assert list(decision.block_hashes) == prefix_hashes(PREFIX, 16, cache_salt="t")

    def test_load_outweighs_a_small_overlap(self) -> None:
        core = _core()
        core.sync.index.store("w1", prefix_hashes(PREFIX, 16)[:1])
        for i in range(4):
            core.commit(core.decide(_gen(f"x{i}", tuple(range(i * 1000, i * 1000 + 256))),
                                    _cards("w1"), now=0, rng=RNG), now=0)  # fmt: skip
        assert core.decide(_gen(), _cards("w1", "w2"), now=0, rng=RNG).worker_id == "w2"

    def test_overlap_weight_override_zero_ignores_the_cache(self) -> None:
        core = _core()
        core.sync.index.store("w1", prefix_hashes(PREFIX, 16))
        core.commit(core.decide(_gen("busy", tuple(range(64))), _cards("w1"), now=0, rng=RNG), 0)
        hints = RoutingHints(overlap_score_weight=0.0)
        assert (
            core.decide(_gen(routing=hints), _cards("w1", "w2"), now=0, rng=RNG).worker_id == "w2"
        )

    def test_salted_request_does_not_match_unsalted_cache(self) -> None:
        core = _core()
        core.sync.index.store("w1", prefix_hashes(PREFIX, 16))
        salted = _gen(routing=RoutingHints(cache_salt="tenant-b"))
        assert core.decide(salted, _cards("w1", "w2"), now=0, rng=RNG).overlap_blocks == 0
        lora = _gen(routing=RoutingHints(lora_name="adapter"))
        holder = WorkerCard(
            worker_id="w1", model="m", loras=(LoraAdapter(name="adapter", path="/a"),)
        )
        assert core.decide(lora, [holder], now=0, rng=RNG).overlap_blocks == 0

    def test_an_adapters_request_goes_only_to_its_holders(self) -> None:
        core = _core()
        holder = WorkerCard(worker_id="w2", model="m", loras=(LoraAdapter(name="a", path="/a"),))
        lora = _gen(routing=RoutingHints(lora_name="a"))
        picks = {
            core.decide(lora, [*_cards("w1", "w3"), holder], now=0, rng=random.Random(i)).worker_id
            for i in range(20)
        }
        assert picks == {"w2"}
        assert core.decide(lora, [holder], now=0, rng=RNG).lora_name == "a"

    def test_an_adapter_nobody_holds_is_no_worker_available(self) -> None:
        lora = _gen(routing=RoutingHints(lora_name="a"))
        with pytest.raises(NoWorkerAvailable, match="holds LoRA adapter a"):
            _core().decide(lora, _cards("w1"), now=0, rng=RNG)

    def test_identical_idle_workers_are_chosen_at_random(self) -> None:
        core = _core()
        picks = {core.decide(_gen(), _cards("a", "b", "c"), now=0, rng=random.Random(i)).worker_id
                 for i in range(60)}  # fmt: skip
        assert picks == {"a", "b", "c"}


class TestInflightOverlap:
    """A prefix that requests routed to a worker are computing counts as overlap there."""

    def _with_a_in_flight(self, **kw: object) -> RoutingCore:
        core = _core(**kw)
        core.commit(core.decide(_gen("a"), _cards("w1"), now=0, rng=RNG), 0)
        core.on_phase(RequestPhase(request_id="a", worker_id="w1", phase="prefill_done"))
        return core  # w1 computed PREFIX; its KV events have not reached the index yet

    def test_it_goes_where_its_prefix_is_being_computed_before_any_kv_event(self) -> None:
        core = self._with_a_in_flight()
        suffixed = _gen("b", (*PREFIX, 1, 2, 3))
        for seed in range(20):
            decision = core.decide(suffixed, _cards("w1", "w2"), now=0, rng=random.Random(seed))
            assert (decision.worker_id, decision.overlap_blocks, decision.prefill_tokens) == (
                "w1",
                8,
                3,
            )
        w1 = decision.candidates[0]
        assert (w1.overlap_blocks, w1.inflight_blocks, w1.prefill_blocks) == (8, 8, 3 / 16)

    def test_a_burst_sharing_a_new_prefix_joins_it_rather_than_an_idle_worker(self) -> None:
        core = _core()  # a is still prefilling PREFIX on w1; w2 is idle
        core.commit(core.decide(_gen("a"), _cards("w1"), now=0, rng=RNG), 0)
        for seed in range(20):
            decision = core.decide(
                _gen("b", (*PREFIX, 1, 2, 3)), _cards("w1", "w2"), now=0, rng=random.Random(seed)
            )
            assert (decision.worker_id, decision.prefill_tokens) == ("w1", 3)
        w1, w2 = decision.candidates
        assert w1.prefill_blocks == 3 / 16  # a's pending prefix prefill is no queue
        assert w1.cost < w2.cost

    def test_switched_off_a_burst_spreads_and_recomputes_the_prefix(self) -> None:
        core = _core(inflight_overlap=False)
        core.commit(core.decide(_gen("a"), _cards("w1"), now=0, rng=RNG), 0)
        decision = core.decide(_gen("b", (*PREFIX, 1, 2, 3)), _cards("w1", "w2"), now=0, rng=RNG)
        assert (decision.worker_id, decision.prefill_tokens) == ("w2", 131)

    def test_cached_overlap_is_not_counted_twice(self) -> None:
        core = self._with_a_in_flight()
        core.sync.index.store("w1", prefix_hashes(PREFIX, 16)[:5])
        w1 = core.decide(_gen("b"), _cards("w1"), now=0, rng=RNG).candidates[0]
        assert (w1.overlap_blocks, w1.inflight_blocks) == (8, 3)

    def test_only_its_own_tokens_load_the_worker_with_prefill(self) -> None:
        core = _core()
        core.commit(core.decide(_gen("a"), _cards("w1"), now=0, rng=RNG), 0)
        core.commit(core.decide(_gen("b", (*PREFIX, 1, 2, 3)), _cards("w1"), now=0, rng=RNG), 0)
        assert core.load.prefill_tokens("w1") == 128 + 3

    def test_switched_off_only_the_index_counts(self) -> None:
        core = self._with_a_in_flight(inflight_overlap=False)
        picks = set()
        for seed in range(40):
            decision = core.decide(_gen("b"), _cards("w1", "w2"), now=0, rng=random.Random(seed))
            assert (decision.overlap_blocks, decision.candidates[0].inflight_blocks) == (0, 0)
            picks.add(decision.worker_id)
        assert picks == {"w1", "w2"}  # equal costs: the prefix in flight on w1 earns nothing

    def test_round_robin_over_a_large_fleet_cycles_in_id_order_and_lists_the_chosen(
        self,
    ) -> None:
        core = RoutingCore(CoreSettings(mode="round-robin"))
        cards = _cards(*(f"w{i:03d}" for i in range(100)))
        random.Random(3).shuffle(cards)
        picks = []
        for i in range(101):
            decision = core.decide(_gen(f"r{i}"), cards, now=0, rng=RNG)
            assert [c.worker_id for c in decision.candidates] == [decision.worker_id]
            assert decision.unlisted_workers == 99
            picks.append(decision.worker_id)
        assert picks == [f"w{i:03d}" for i in range(100)] + ["w000"]

    def test_round_robin_reports_none(self) -> None:
        core = RoutingCore(CoreSettings(mode="round-robin"))
        core.commit(core.decide(_gen("a"), _cards("w1"), now=0, rng=RNG), 0)
        decision = core.decide(_gen("b"), _cards("w1"), now=0, rng=RNG)
        assert decision.candidates[0].inflight_blocks == 0


class TestLoadAccounting:
    def test_prefill_leaves_at_prefill_done_and_blocks_at_finished(self) -> None:
        core = _core()
        core.commit(core.decide(_gen(), _cards("w1"), now=0, rng=RNG), now=0)
        assert (core.load.prefill_tokens("w1"), core.load.decode_blocks("w1")) == (128, 8)
        core.on_phase(RequestPhase(request_id="r1", worker_id="w1", phase="prefill_done"))
        assert (core.load.prefill_tokens("w1"), core.load.decode_blocks("w1")) == (0, 8)
        core.on_phase(RequestPhase(request_id="r1", worker_id="w1", phase="finished"))
        assert core.load.decode_blocks("w1") == 0

    def test_cancel_frees_the_request(self) -> None:
        core = _core()
        core.commit(core.decide(_gen(), _cards("w1"), now=0, rng=RNG), now=0)
        core.on_cancel("r1")
        assert len(core.load) == 0

    def test_requests_sharing_a_prefix_share_its_decode_blocks(self) -> None:
        core = _core()
        core.commit(core.decide(_gen("a", (*PREFIX, 1, 2, 3)), _cards("w1"), now=0, rng=RNG), 0)
        core.commit(core.decide(_gen("b", (*PREFIX, 4, 5)), _cards("w1"), now=0, rng=RNG), 0)
        assert core.load.decode_blocks("w1") == 8 + 1 + 1  # shared prefix + two partial tails

    def test_a_request_with_an_active_prefix_costs_only_its_tail(self) -> None:
        core = _core()
        core.commit(core.decide(_gen("a"), _cards("w1"), now=0, rng=RNG), 0)
        decision = core.decide(_gen("b", (*PREFIX, 9)), _cards("w1"), now=0, rng=RNG)
        assert decision.candidates[0].decode_blocks == 8 + 1

    def test_stale_requests_expire(self) -> None:
        core = _core()
        core.load.ttl_s = 10
        core.commit(core.decide(_gen(), _cards("w1"), now=0, rng=RNG), now=0)
        assert core.sweep(5) == (0, 0)
        assert core.sweep(11) == (1, 0)
        assert core.load.decode_blocks("w1") == 0

    def test_a_worker_report_ends_the_oldest_requests_it_no_longer_holds(self) -> None:
        # Ends that were never heard (lifecycle messages lost while nats-server was away).
        core = _core()
        for i in range(3):
            core.commit(core.decide(_gen(f"r{i}"), _cards("w1"), now=i, rng=RNG), now=i)
        assert core.on_load(WorkerLoad(worker_id="w1", active=1), now=10) == ["r0", "r1"]
        assert core.load.worker_of("r2") == "w1"
        assert core.load.requests("w1") == 1
        assert core.on_load(WorkerLoad(worker_id="w1", active=1), now=11) == []

    def test_waiting_requests_count_as_held(self) -> None:
        core = _core()
        for i in range(3):
            core.commit(core.decide(_gen(f"r{i}"), _cards("w1"), now=0, rng=RNG), now=0)
        assert core.on_load(WorkerLoad(worker_id="w1", active=1, waiting=2), now=10) == []
        assert core.load.requests("w1") == 3

    def test_a_request_on_its_way_is_not_ended_by_a_report_that_misses_it(self) -> None:
        core = _core()
        core.commit(core.decide(_gen("old"), _cards("w1"), now=0, rng=RNG), now=0)
        core.commit(core.decide(_gen("new"), _cards("w1"), now=9, rng=RNG), now=9)
        # "new" (1 s old) may not be there yet, and may be the one the worker counts.
        assert core.on_load(WorkerLoad(worker_id="w1", active=1), now=10) == []
        assert core.on_load(WorkerLoad(worker_id="w1", active=0), now=10) == ["old"]
        assert core.load.worker_of("new") == "w1"
        assert core.on_load(WorkerLoad(worker_id="w1", active=0), now=20) == ["new"]
        assert len(core.load) == 0

    def test_another_workers_report_ends_nothing_here(self) -> None:
        core = _core()
        core.commit(core.decide(_gen(), _cards("w1"), now=0, rng=RNG), now=0)
        assert core.on_load(WorkerLoad(worker_id="w2", active=0), now=10) == []
        assert core.load.requests("w1") == 1

    def test_expected_output_tokens_count_in_the_decode_load_from_the_start(self) -> None:
        core = _core()
        hints = RoutingHints(osl=100)  # 7 blocks of 16
        decision = core.decide(_gen(routing=hints), _cards("w1"), now=0, rng=RNG)
        assert decision.output_blocks == 7
        core.commit(decision, 0)
        assert core.load.decode_blocks("w1") == 8 + 7
        core.on_phase(RequestPhase(request_id="r1", worker_id="w1", phase="finished"))
        assert core.load.decode_blocks("w1") == 0

    def test_rerouting_a_request_moves_its_load(self) -> None:
        core = _core()
        core.commit(core.decide(_gen(), _cards("w1"), now=0, rng=RNG), 0)
        core.commit(core.decide(_gen(), _cards("w2"), now=0, rng=RNG), 0)
        assert (core.load.requests("w1"), core.load.requests("w2")) == (0, 1)


class TestBusy:
    def _busy_core(self, status: int = 503) -> RoutingCore:
        return _core(busy=BusyThresholds(decode_blocks_frac=0.5, prefill_tokens=1000),
                     busy_status=status, busy_retry_after_s=2.0)  # fmt: skip

    def test_busy_workers_are_skipped(self) -> None:
        core = self._busy_core()
        core.sync.index.store("w1", prefix_hashes(PREFIX, 16))
        core.on_load(WorkerLoad(worker_id="w1", kv_used_blocks=900, kv_total_blocks=1000), now=0)
        decision = core.decide(_gen(), _cards("w1", "w2"), now=1, rng=RNG)
        assert decision.worker_id == "w2"
        assert [c.busy for c in decision.candidates] == [True, False]

    def test_tracked_prefill_tokens_mark_a_worker_busy(self) -> None:
        core = self._busy_core()
        core.commit(core.decide(_gen("big", tuple(range(2000))), _cards("w1"), now=0, rng=RNG), 0)
        assert core.decide(_gen(), _cards("w1", "w2"), now=0, rng=RNG).worker_id == "w2"

    @pytest.mark.parametrize("status", [503, 529])
    def test_all_busy_is_rejected_with_retry_after(self, status: int) -> None:
        core = self._busy_core(status)
        core.on_load(WorkerLoad(worker_id="w1", prefill_tokens=5000), now=0)
        with pytest.raises(AllWorkersBusy, match="busy") as info:
            core.decide(_gen(), _cards("w1"), now=0, rng=RNG)
        assert (info.value.status, info.value.retry_after_s) == (status, 2.0)
        assert info.value.headers() == {"Retry-After": "2"}

    def test_busy_mark_expires_when_reports_stop(self) -> None:
        core = self._busy_core()
        core.on_load(WorkerLoad(worker_id="w1", kv_used_blocks=999, kv_total_blocks=1000), now=0)
        assert core.reports.stale_s == 5.0
        assert core.decide(_gen(), _cards("w1"), now=6, rng=RNG).worker_id == "w1"

    def test_card_capacity_stands_in_for_a_report_without_total(self) -> None:
        core = self._busy_core()
        core.on_load(WorkerLoad(worker_id="w1", kv_used_blocks=600), now=0)
        with pytest.raises(AllWorkersBusy):
            core.decide(_gen(), _cards("w1", kv_blocks=1000), now=0, rng=RNG)


class TestPinning:
    def test_pinned_worker_is_used_and_its_load_counted(self) -> None:
        core = _core(busy=BusyThresholds(prefill_tokens=0))
        decision = core.decide(_gen(worker_id="w2"), _cards("w1", "w2"), now=0, rng=RNG)
        core.commit(decision, 0)
        assert (decision.worker_id, decision.mode) == ("w2", "direct")
        assert core.load.requests("w2") == 1

    def test_pinned_worker_the_registry_does_not_know_is_a_bad_request(self) -> None:
        with pytest.raises(InvalidRequest, match="w9") as caught:
            _core().decide(_gen(worker_id="w9"), _cards("w1"), now=0, rng=RNG)
        assert caught.value.param == "nvext.backend_instance_id"

    def test_pinned_worker_known_but_not_live_is_unavailable(self) -> None:
        dead = _cards("w9")[0]
        with pytest.raises(NoWorkerAvailable, match="w9 is not live"):
            _core().decide(
                _gen(worker_id="w9"), _cards("w1"), now=0, rng=RNG, known={"w9": dead}.get
            )

    def test_direct_mode_needs_a_pinned_worker(self) -> None:
        core = RoutingCore(CoreSettings(mode="direct"))
        with pytest.raises(InvalidRequest, match="direct"):
            core.decide(_gen(), _cards("w1"), now=0, rng=RNG)

    def test_no_live_worker(self) -> None:
        with pytest.raises(NoWorkerAvailable):
            _core().decide(_gen(), [], now=0, rng=RNG)


class TestApproximateMode:
    def test_chosen_worker_is_assumed_to_cache_the_prompt_until_the_ttl(self) -> None:
        core = _core(use_kv_events=False)
        core.approx.ttl_s = 120
        first = core.decide(_gen("a"), _cards("w1", "w2"), now=0, rng=RNG)
        core.commit(first, 0)
        core.on_phase(RequestPhase(request_id="a", worker_id=first.worker_id, phase="finished"))
        again = core.decide(_gen("b"), _cards("w1", "w2"), now=60, rng=RNG)
        assert (again.worker_id, again.overlap_blocks, again.mode) == (
            first.worker_id,
            8,
            "kv-approx",
        )
        core.sweep(121)
        assert core.decide(_gen("c"), _cards("w1", "w2"), now=121, rng=RNG).overlap_blocks == 0

    def test_routing_again_refreshes_the_ttl(self) -> None:
        core = _core(use_kv_events=False)
        core.approx.ttl_s = 100
        core.commit(core.decide(_gen("a"), _cards("w1"), now=0, rng=RNG), 0)
        core.commit(core.decide(_gen("b"), _cards("w1"), now=90, rng=RNG), 90)
        for rid in ("a", "b"):  # finished: no in-flight overlap left, only the assumed cache
            core.on_phase(RequestPhase(request_id=rid, worker_id="w1", phase="finished"))
        core.sweep(150)
        assert core.decide(_gen("c"), _cards("w1"), now=150, rng=RNG).overlap_blocks == 8
        core.sweep(191)
        assert core.decide(_gen("d"), _cards("w1"), now=191, rng=RNG).overlap_blocks == 0


def test_removed_worker_loses_index_and_load() -> None:
    core = _core()
    core.sync.index.store("w1", prefix_hashes(PREFIX, 16))
    core.commit(core.decide(_gen(), _cards("w1"), now=0, rng=RNG), 0)
    assert core.remove_worker("w1")
    assert core.known_workers() == set()


class TestAllowedWorkers:
    def test_only_allowed_workers_are_candidates_even_against_the_cache(self) -> None:
        core = _core()
        core.sync.index.store("w2", prefix_hashes(PREFIX, 16))
        hints = RoutingHints(allowed_worker_ids=("w1", "w3"))
        decision = core.decide(_gen(routing=hints), _cards("w1", "w2", "w3"), now=0, rng=RNG)
        assert decision.worker_id in {"w1", "w3"}
        assert [c.worker_id for c in decision.candidates] == ["w1", "w3"]

    def test_no_allowed_worker_alive_is_no_worker_available(self) -> None:
        hints = RoutingHints(allowed_worker_ids=("gone",))
        with pytest.raises(NoWorkerAvailable, match="allowed_worker_ids"):
            _core().decide(_gen(routing=hints), _cards("w1"), now=0, rng=RNG)


class TestEventlessWorkers:
    """A worker whose engine publishes no KV events (``WorkerCard.kv_events=False``, e.g. the
    transformers engine) is routed on an estimate of its cache, in kv mode."""

    @staticmethod
    def _mixed() -> list[WorkerCard]:
        return [
            WorkerCard(worker_id="ev", model="m", block_size=16, kv_blocks=1000),
            WorkerCard(worker_id="hf", model="m", block_size=16, kv_blocks=1000, kv_events=False),
        ]

    def test_a_prefix_sent_to_an_eventless_worker_goes_there_again(self) -> None:
        core = _core()
        cards = self._mixed()
        first = core.decide(_gen("a"), cards[1:], now=0, rng=RNG)  # only hf is live
        core.commit(first, now=0)
        core.on_phase(RequestPhase(request_id="a", worker_id="hf", phase="finished"))
        again = core.decide(_gen("b"), cards, now=1, rng=RNG)
        assert (again.worker_id, again.overlap_blocks) == ("hf", 8)  # no event ever said so

    def test_the_estimate_is_used_for_the_eventless_worker_only(self) -> None:
        core = _core()
        core.sync.index.store("ev", prefix_hashes(PREFIX, 16))
        core.approx.remember("ev", prefix_hashes(PREFIX, 16)[:2], 0)  # ignored: ev has events
        decision = core.decide(_gen(), self._mixed(), now=0, rng=RNG)
        assert (decision.worker_id, decision.overlap_blocks) == ("ev", 8)
        core.commit(core.decide(_gen("x"), self._mixed()[1:], now=0, rng=RNG), now=0)
        assert core.approx.find_matches(prefix_hashes(PREFIX, 16)).get("hf") == 8
        assert core.remove_worker("hf")
        assert "hf" not in core.eventless
