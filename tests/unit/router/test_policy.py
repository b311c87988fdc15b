"""Round-robin and random modes as the router runs them (``RoutingCore.decide``)."""

from __future__ import annotations

import random

import pytest

from services.router.core import CoreSettings, RoutingCore
from services.router.policy import Random, RoundRobin, build_policy
from shared.errors import InvalidRequest, NoWorkerAvailable
from shared.messages import Generate, SamplingParams, WorkerCard

RNG = random.Random(0)


def _gen(model: str = "m", worker_id: str | None = None) -> Generate:
    return Generate(
        request_id="r1",
        model=model,
        token_ids=(1, 2, 3),
        sampling=SamplingParams(),
        stream_to="s",
        worker_id=worker_id,
    )


def _cards(*ids: str, model: str = "m") -> list[WorkerCard]:
    return [WorkerCard(worker_id=i, model=model) for i in ids]


def _pick(core: RoutingCore, gen: Generate, workers: list[WorkerCard]) -> str:
    return core.decide(gen, workers, now=0.0, rng=RNG).worker_id


def _core(mode: str, seed: int | None = None) -> RoutingCore:
    return RoutingCore(CoreSettings(mode=mode, seed=seed))


class TestRoundRobin:
    def test_cycles_through_workers_in_id_order(self) -> None:
        core = _core("round-robin")
        workers = _cards("w2", "w1", "w3")
        picks = [_pick(core, _gen(), workers) for _ in range(6)]
        assert picks == ["w1", "w2", "w3", "w1", "w2", "w3"]

    def test_each_model_has_its_own_cursor(self) -> None:
        core = _core("round-robin")
        a, b = _cards("a1", "a2", model="A"), _cards("b1", "b2", model="B")
        picks = [
            _pick(core, _gen("A"), a),
            _pick(core, _gen("B"), b),
            _pick(core, _gen("A"), a),
            _pick(core, _gen("B"), b),
        ]
        assert picks == ["a1", "b1", "a2", "b2"]

    def test_keeps_cycling_when_a_worker_leaves(self) -> None:
        core = _core("round-robin")
        _pick(core, _gen(), _cards("w1", "w2", "w3"))
        picks = [_pick(core, _gen(), _cards("w1", "w3")) for _ in range(2)]
        assert sorted(picks) == ["w1", "w3"]

    def test_choose_alone_cycles_in_id_order(self) -> None:
        policy = RoundRobin()
        picks = [policy.choose(_gen(), _cards("w2", "w1")).worker_id for _ in range(3)]
        assert picks == ["w1", "w2", "w1"]


class TestRandom:
    def test_same_seed_gives_the_same_choices(self) -> None:
        workers = _cards("w1", "w2", "w3", "w4")
        one, two = _core("random", seed=7), _core("random", seed=7)
        assert [_pick(one, _gen(), workers) for _ in range(20)] == [
            _pick(two, _gen(), workers) for _ in range(20)
        ]

    def test_input_order_does_not_change_seeded_choices(self) -> None:
        one, two = Random(3), Random(3)
        seq_one = [one.choose(_gen(), _cards("a", "b", "c")).worker_id for _ in range(10)]
        seq_two = [two.choose(_gen(), _cards("c", "a", "b")).worker_id for _ in range(10)]
        assert seq_one == seq_two

    def test_reaches_every_worker(self) -> None:
        core = _core("random", seed=0)
        workers = _cards("w1", "w2", "w3")
        assert {_pick(core, _gen(), workers) for _ in range(100)} == {"w1", "w2", "w3"}


@pytest.mark.parametrize("mode", ["round-robin", "random"])
def test_no_live_worker_raises_no_worker_available(mode: str) -> None:
    with pytest.raises(NoWorkerAvailable, match="no live worker") as info:
        _pick(_core(mode, seed=1), _gen(), [])
    assert info.value.status == 503
    assert info.value.retry_after_s == 1.0


class TestPinnedWorker:
    def test_live_pinned_worker_is_used_without_moving_the_cursor(self) -> None:
        core = _core("round-robin")
        workers = _cards("w1", "w2")
        assert _pick(core, _gen(worker_id="w2"), workers) == "w2"
        assert _pick(core, _gen(), workers) == "w1"

    def test_pinned_worker_that_is_not_known_is_a_bad_request(self) -> None:
        with pytest.raises(InvalidRequest, match="w9") as info:
            _pick(_core("round-robin"), _gen(worker_id="w9"), _cards("w1"))
        assert (info.value.status, info.value.param) == (400, "nvext.backend_instance_id")


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown router mode"):
        build_policy("kv-magic")
