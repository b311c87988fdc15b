"""The mocker's ``WorkerEngine`` with disaggregation and data-parallel ranks, driven through its
``run`` loop with a recording sink: ranks have separate caches and say so in their events; a pull
does not hold up the loop's other requests, takes at least its modelled time, and ends cleanly
when cancelled; pins time out on an idle engine. Bounded waits only: no wall-clock upper bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from services.mocker.config import MockerConfig
from services.mocker.data_parallel import DataParallelEngine, make_engine
from services.mocker.model import ModelInfo
from services.mocker.simulated import SimulatedEngine
from services.mocker.transfer import handle
from shared.errors import ServiceError
from shared.hashing import SEED, local_block_hashes, sequence_hashes
from shared.messages import AllBlocksCleared, BlockStored, SamplingParams
from shared.worker.engine import WorkerEngine
from shared.worker.records import Emission, EngineError, EngineInput, EnginePhase
from tests.support import eventually_async

BS = 4
PROMPT = tuple(range(1, 11))
HASHES = sequence_hashes(local_block_hashes(PROMPT, BS))[:2]
BOUND_S = 10.0
"""Only a hang runs into this."""


class Sink:
    """An ``EmissionSink`` that records what it is handed."""

    def __init__(self) -> None:
        self.emissions: list[Emission] = []
        self.pulled: list[tuple[str, int, float]] = []

    def add(self, emission: Emission) -> bool:
        self.emissions.append(emission)
        return True

    async def flush(self, request_ids: Sequence[str] | None = None) -> None:
        return None

    async def phases(self, emissions: Sequence[Emission]) -> None:
        return None

    async def fail(self, request_id: str, error: ServiceError) -> None:
        raise AssertionError(f"{request_id} failed: {error}")

    def collect(self) -> None:
        return None

    async def progress(self) -> None:
        return None

    async def kv_pulled(self, request_id: str, pulled_blocks: int) -> None:
        self.pulled.append((request_id, pulled_blocks, time.monotonic()))

    def done(self, request_id: str) -> bool:
        return any(e.done for e in self.emissions if e.request_id == request_id)

    def first(self, request_id: str) -> Emission:
        return next(e for e in self.emissions if e.request_id == request_id)


def _model(tmp_path: Path) -> ModelInfo:
    corpus = tuple(range(1000, 1200))
    return ModelInfo(tmp_path, corpus, eos_token_ids=(), context_length=4096, created=0)


def _config(**overrides: object) -> MockerConfig:
    settings: dict[str, object] = {
        "speedup_ratio": 0.0,
        "block_size": BS,
        "num_gpu_blocks_override": 64,
    }
    settings.update(overrides)
    return MockerConfig(**settings)  # type: ignore[arg-type]


def _input(
    rid: str,
    prompt: tuple[int, ...] = PROMPT,
    *,
    max_tokens: int = 3,
    dp_rank: int = 0,
    phase: EnginePhase = "both",
    params: dict[str, object] | None = None,
) -> EngineInput:
    return EngineInput(
        request_id=rid,
        token_ids=prompt,
        sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        hash_seed=SEED,
        dp_rank=dp_rank,
        phase=phase,
        kv_transfer_params=params,
    )


async def _serve(engine: WorkerEngine, *requests: EngineInput) -> Sink:
    sink = Sink()
    for request in requests:
        engine.add(request)
    await asyncio.wait_for(engine.run(sink), BOUND_S)
    return sink


class TestDataParallel:
    async def test_one_rank_is_a_plain_simulated_engine(self, tmp_path: Path) -> None:
        assert isinstance(make_engine(_config(), _model(tmp_path)), SimulatedEngine)

    async def test_ranks_have_separate_caches_and_events_say_which(self, tmp_path: Path) -> None:
        engine = make_engine(_config(data_parallel_size=2), _model(tmp_path))
        assert isinstance(engine, DataParallelEngine)
        engine.reset_cache()
        sink = await _serve(engine, _input("a", dp_rank=1))
        assert sink.done("a")
        events = engine.take_kv_events()
        cleared = [e.dp_rank for e in events if isinstance(e, AllBlocksCleared)]
        stored = [e for e in events if isinstance(e, BlockStored)]
        assert cleared == [0, 1]
        assert {e.dp_rank for e in stored} == {1}
        assert stored[0].block_hashes[:2] == tuple(HASHES)  # then a generated block
        dump = engine.kv_dump(with_tokens=False)
        assert [e.dp_rank for e in dump] == [1]
        assert dump[0].block_hashes[:2] == tuple(HASHES)
        sink = await _serve(engine, _input("b", dp_rank=0), _input("c", dp_rank=1))
        assert sink.first("b").cached_tokens == 0  # rank 0 never saw the prompt
        assert sink.first("c").cached_tokens == 8
        stored_by_rank = {e.dp_rank for e in engine.take_kv_events() if isinstance(e, BlockStored)}
        assert stored_by_rank == {0}
        assert {e.dp_rank for e in engine.kv_dump(with_tokens=True)} == {0, 1}

    async def test_load_adds_the_ranks_up(self, tmp_path: Path) -> None:
        engine = make_engine(_config(data_parallel_size=3), _model(tmp_path))
        engine.add(_input("a", dp_rank=0))
        engine.add(_input("b", dp_rank=2))
        load = engine.load()
        assert (load.waiting, load.kv_total_blocks, load.prefill_tokens) == (2, 3 * 64, 20)
        assert engine.num_waiting == 2
        assert "b" in engine
        assert engine.cancel("b") is not None
        assert "b" not in engine

    async def test_a_rank_out_of_range_is_refused(self, tmp_path: Path) -> None:
        engine = make_engine(_config(data_parallel_size=2), _model(tmp_path))
        with pytest.raises(EngineError):
            engine.add(_input("a", dp_rank=2))

    async def test_ranks_step_concurrently(self, tmp_path: Path) -> None:
        engine = make_engine(_config(data_parallel_size=2, speedup_ratio=1.0), _model(tmp_path))
        sink = Sink()
        engine.add(_input("a", max_tokens=200, dp_rank=0))
        task = asyncio.create_task(engine.run(sink))
        try:
            await eventually_async(
                lambda: len(sink.emissions) >= 2,
                timeout_s=BOUND_S,
                interval_s=0.005,
                message="rank 0 never emitted twice",
            )
            engine.add(_input("b", dp_rank=1))  # rank 1 was idle: run starts its loop
            await eventually_async(
                lambda: sink.done("b"),
                timeout_s=BOUND_S,
                interval_s=0.005,
                message="rank 1 never finished its request",
            )
            assert not sink.done("a")
        finally:
            engine.cancel("a")
            await asyncio.wait_for(task, BOUND_S)

    async def test_prefill_on_a_rank_pins_there(self, tmp_path: Path) -> None:
        engine = make_engine(_config(data_parallel_size=2), _model(tmp_path))
        sink = await _serve(engine, _input("p", max_tokens=9, dp_rank=1, phase="prefill"))
        (emission,) = sink.emissions
        assert emission.kv_transfer_params is not None
        assert emission.kv_transfer_params["dp_rank"] == 1
        assert engine.load().kv_used_blocks == 2
        assert engine.release_kv("p")
        assert engine.load().kv_used_blocks == 0


class TestPulls:
    async def test_a_pull_does_not_hold_up_other_requests(self, tmp_path: Path) -> None:
        engine = SimulatedEngine(
            _config(speedup_ratio=1.0, kv_transfer_latency_ms=60_000.0), _model(tmp_path)
        )
        sink = Sink()
        params = handle(HASHES, block_size=BS, block_bytes=1000, dp_rank=0)
        engine.add(_input("d", phase="decode", params=params))
        task = asyncio.create_task(engine.run(sink))
        try:
            await eventually_async(  # the loop sleeps on the pull
                lambda: "d" in engine.engine.pulls,
                timeout_s=BOUND_S,
                interval_s=0.005,
                message="the decode never started its pull",
            )
            engine.add(_input("a", (90, 91, 92)))
            await eventually_async(
                lambda: sink.done("a"),
                timeout_s=BOUND_S,
                interval_s=0.005,
                message="a request behind the pull never finished",
            )
            assert "d" in engine.engine.pulls
            assert sink.pulled == []
            cancelled = engine.cancel("d")  # cancel while pulling: the loop ends
            assert cancelled is not None
            assert cancelled.finish_reason == "cancelled"
            await asyncio.wait_for(task, BOUND_S)
        finally:
            task.cancel()
        assert sink.pulled == []
        assert engine.load().kv_used_blocks == 0
        assert not engine.has_work

    async def test_the_pull_takes_at_least_its_modelled_time(self, tmp_path: Path) -> None:
        config = _config(
            speedup_ratio=2.0,
            kv_block_bytes=1_000_000,
            kv_transfer_bandwidth_gbps=1.0,
            kv_transfer_latency_ms=100.0,
        )
        engine = SimulatedEngine(config, _model(tmp_path))
        params = handle(HASHES, block_size=BS, block_bytes=1_000_000, dp_rank=0)
        started = time.monotonic()
        sink = await _serve(engine, _input("d", phase="decode", params=params))
        expected = (2 * 1_000_000 / 1e9 + 0.1) / 2.0
        ((rid, blocks, at),) = sink.pulled
        assert (rid, blocks) == ("d", 2)
        assert at - started >= expected - 0.005  # a lower bound only: never flaky when slow
        assert sink.first("d").cached_tokens == 8
        assert sink.done("d")

    async def test_speedup_zero_pulls_at_once(self, tmp_path: Path) -> None:
        engine = SimulatedEngine(_config(), _model(tmp_path))
        params = handle(HASHES, block_size=BS, block_bytes=1000, dp_rank=0)
        sink = await _serve(engine, _input("d", phase="decode", params=params))
        assert [(r, b) for r, b, _ in sink.pulled] == [("d", 2)]
        assert sink.done("d")


class TestPins:
    async def test_pins_time_out_on_an_idle_engine(self, tmp_path: Path) -> None:
        engine = SimulatedEngine(_config(kv_pin_timeout_s=0.05), _model(tmp_path))
        facts = await engine.start()
        assert facts.kv_pin_timeout_s == 0.05
        await _serve(engine, _input("p", phase="prefill"))
        assert engine.load().kv_used_blocks == 2
        await eventually_async(
            lambda: engine.load().kv_used_blocks == 0,
            timeout_s=BOUND_S,
            interval_s=0.005,
            message="the idle engine's pins never timed out",
        )
        assert not engine.release_kv("p")
        await engine.stop()

    async def test_release_unpins(self, tmp_path: Path) -> None:
        engine = SimulatedEngine(_config(), _model(tmp_path))
        sink = await _serve(engine, _input("p", max_tokens=20, phase="prefill"))
        (emission,) = sink.emissions
        assert emission.token_ids
        assert emission.done
        assert engine.release_kv("p")
        assert engine.load().kv_used_blocks == 0
        await engine.stop()
