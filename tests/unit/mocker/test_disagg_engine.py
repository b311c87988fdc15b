"""The simulated engine's disaggregated phases, on an injected clock: a prefill pins its prompt
blocks until released or timed out; a decode pulls only the named blocks it lacks, in the time
the transfer model says, and a cancel while pulling frees everything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.mocker.engine import Emission, Engine, EngineConfig
from services.mocker.transfer import (
    DEFAULT_KV_BYTES_PER_TOKEN,
    handle,
    kv_bytes_per_token,
    named_blocks,
    pull_seconds,
    read_kv_bytes_per_token,
)
from shared.hashing import local_block_hashes, sequence_hashes
from shared.messages import AnyKvEvent, BlockStored, SamplingParams
from shared.model_dir import QWEN3_0_6B_CONFIG, TINY_QWEN3

CORPUS = tuple(range(1000, 1200))
BS = 4
PROMPT = tuple(range(1, 11))  # 10 tokens: 2 full blocks of 4
HASHES = sequence_hashes(local_block_hashes(PROMPT, BS))[:2]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _engine(clock: Clock | None = None, **overrides: object) -> Engine:
    kwargs: dict[str, object] = {"speedup_ratio": 0.0, "block_size": BS, "eos_token_ids": (7,)}
    kwargs.update(overrides)
    config = EngineConfig(**kwargs)  # type: ignore[arg-type]
    return Engine(config, CORPUS, clock=clock or Clock())


def _sampling(max_tokens: int = 3) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def _run(engine: Engine) -> list[Emission]:
    out: list[Emission] = []
    for _ in range(1000):
        if not engine.has_work:
            return out
        out.extend(engine.step().emissions)
    raise AssertionError("the engine never went idle")


def _prefill(engine: Engine, rid: str = "p", prompt: tuple[int, ...] = PROMPT) -> Emission:
    engine.add(rid, prompt, _sampling(50), phase="prefill")
    (emission,) = _run(engine)
    return emission


def _stored(events: list[AnyKvEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


class TestPrefill:
    def test_one_token_then_the_handle_names_the_prompt_blocks(self) -> None:
        emission = _prefill(_engine(kv_block_bytes=1000))
        assert (len(emission.token_ids), emission.done, emission.finish_reason) == (
            1,
            True,
            "length",
        )
        assert emission.kv_transfer_params == {
            "engine": "mocker",
            "block_hashes": HASHES,
            "num_blocks": 2,
            "block_size": BS,
            "block_bytes": 1000,
            "dp_rank": 0,
        }

    def test_blocks_stay_pinned_until_released(self) -> None:
        engine = _engine(num_gpu_blocks=3)
        _prefill(engine)
        assert engine.load().kv_used_blocks == 2
        engine.add("q", tuple(range(50, 58)), _sampling())  # needs 2 blocks; 1 is free
        assert engine.step().emissions == []
        assert engine.num_waiting == 1  # the pinned blocks are not evictable
        assert engine.release_pin("p")
        assert not engine.release_pin("p")
        assert [e.request_id for e in _run(engine)] == ["q"] * 3

    def test_pin_timeout_frees_blocks_never_pulled(self) -> None:
        clock = Clock()
        engine = _engine(clock, kv_pin_timeout_s=5.0)
        _prefill(engine)
        assert engine.pins.next_expiry == 5.0
        clock.now = 4.9
        assert engine.expire_pins() == []
        assert engine.load().kv_used_blocks == 2
        clock.now = 5.0
        assert engine.expire_pins() == ["p"]
        assert engine.load().kv_used_blocks == 0
        assert engine.cache.cached_blocks == 2  # still cached, now evictable

    def test_a_step_expires_pins_too(self) -> None:
        clock = Clock()
        engine = _engine(clock, kv_pin_timeout_s=5.0)
        _prefill(engine)
        clock.now = 6.0
        engine.add("q", (90, 91), _sampling(1))
        _run(engine)
        assert not engine.pins.pins

    def test_a_cancelled_prefill_pins_nothing(self) -> None:
        engine = _engine()
        engine.add("p", PROMPT, _sampling(50), phase="prefill")
        assert engine.cancel("p") is not None
        assert not engine.pins.pins
        assert engine.load().kv_used_blocks == 0


class TestDecode:
    def test_pulls_only_the_blocks_it_lacks(self) -> None:
        params = handle(HASHES, block_size=BS, block_bytes=1000, dp_rank=0)
        engine = _engine()
        _run_one(engine, "warm", (*PROMPT[:4], 60, 61, 62, 63, 64))  # holds block 0 only
        engine.take_kv_events()
        engine.add("d", PROMPT, _sampling(), phase="decode", kv_transfer=params)
        assert "d" in engine
        assert engine.num_waiting == 1
        out = engine.step()
        assert out.pulled == (("d", 1),)
        assert _stored(engine.take_kv_events()) == [HASHES[1]]
        emissions = [*out.emissions, *_run(engine)]
        assert emissions[0].cached_tokens == 8  # both blocks: one held, one pulled
        assert [len(e.token_ids) for e in emissions] == [1, 1, 1]

    def test_nothing_to_pull_when_every_block_is_held(self) -> None:
        params = handle(HASHES, block_size=BS, block_bytes=1000, dp_rank=0)
        engine = _engine(speedup_ratio=1.0, kv_transfer_latency_ms=50.0)
        _run_one(engine, "warm", PROMPT)
        engine.add("d", PROMPT, _sampling(), phase="decode", kv_transfer=params)
        assert engine.next_pull_at() == 0.0  # no block to move: no latency either
        assert engine.step().pulled == (("d", 0),)

    def test_another_engines_handle_pulls_nothing(self) -> None:
        engine = _engine()
        engine.add("d", PROMPT, _sampling(), phase="decode", kv_transfer={"remote_block_ids": [1]})
        out = engine.step()
        assert out.pulled == (("d", 0),)
        assert [*out.emissions, *_run(engine)][0].cached_tokens == 0

    def test_the_pull_takes_the_modelled_time(self) -> None:
        clock = Clock()
        engine = _engine(
            clock,
            speedup_ratio=2.0,
            kv_block_bytes=1_000_000,
            kv_transfer_bandwidth_gbps=1.0,
            kv_transfer_latency_ms=10.0,
        )
        params = handle(HASHES, block_size=BS, block_bytes=1_000_000, dp_rank=0)
        engine.add("d", PROMPT, _sampling(), phase="decode", kv_transfer=params)
        expected = (2 * 1_000_000 / 1e9 + 0.010) / 2.0  # 2 blocks at 1 GB/s + 10 ms, speedup 2
        assert engine.next_pull_at() == pytest.approx(expected)
        clock.now = expected * 0.99
        out = engine.step()
        assert (out.pulled, out.emissions) == ((), [])
        assert engine.has_work
        assert not engine.is_stepping
        clock.now = expected
        out = engine.step()
        assert out.pulled == (("d", 2),)
        # the prefill worker computed the whole prompt (its partial block travels too): the
        # first token comes from a decode step, as from a vLLM decode instance
        assert (out.prefill_tokens, out.decode_seqs) == (0, 1)
        assert [e.token_ids for e in out.emissions if e.request_id == "d"] != []

    def test_other_requests_step_while_one_pulls(self) -> None:
        clock = Clock()
        engine = _engine(clock, speedup_ratio=1.0, kv_transfer_latency_ms=60_000.0)
        params = handle(HASHES, block_size=BS, block_bytes=1000, dp_rank=0)
        engine.add("d", PROMPT, _sampling(), phase="decode", kv_transfer=params)
        engine.add("a", (90, 91, 92), _sampling())
        assert {e.request_id for e in _steps(engine, 5)} == {"a"}
        assert "d" in engine.pulls

    def test_cancel_while_pulling_frees_everything(self) -> None:
        clock = Clock()
        engine = _engine(clock, speedup_ratio=1.0, kv_transfer_latency_ms=60_000.0)
        _run_one(engine, "warm", (*PROMPT[:4], 60, 61, 62, 63, 64))
        before = engine.load().kv_used_blocks
        params = handle(HASHES, block_size=BS, block_bytes=1000, dp_rank=0)
        engine.add("d", PROMPT, _sampling(), phase="decode", kv_transfer=params)
        assert engine.load().kv_used_blocks == before + 2  # block 0 held, room for block 1
        cancelled = engine.cancel("d")
        assert cancelled is not None
        assert (cancelled.finish_reason, cancelled.done) == (
            "cancelled",
            True,
        )
        assert "d" not in engine
        assert not engine.has_work
        assert engine.load().kv_used_blocks == before
        clock.now = 120.0
        assert engine.step().pulled == ()

    def test_no_room_computes_the_blocks_instead(self) -> None:
        engine = _engine(num_gpu_blocks=3)
        engine.add("big", tuple(range(50, 58)), _sampling(2))
        engine.step()  # "big" holds 2 of the 3 blocks
        params = handle(HASHES, block_size=BS, block_bytes=1000, dp_rank=0)
        engine.add("d", PROMPT, _sampling(1), phase="decode", kv_transfer=params)
        assert engine.pulls.pending["d"].count == 0
        out = engine.step()
        assert out.pulled == (("d", 0),)
        first = next(e for e in [*out.emissions, *_run(engine)] if e.request_id == "d")
        assert (first.prompt_tokens, first.cached_tokens, first.done) == (10, 0, True)


class TestRanks:
    def test_events_and_dumps_carry_the_rank(self) -> None:
        engine = _engine(dp_rank=3)
        engine.reset_cache()
        _run_one(engine, "a", PROMPT)
        events = engine.take_kv_events()
        assert events
        assert all(e.dp_rank == 3 for e in events)
        assert all(e.dp_rank == 3 for e in engine.cache.dump())


class TestTransferModel:
    def test_formula(self) -> None:
        seconds = pull_seconds(
            256, block_bytes=1_835_008, bandwidth_gbps=25.0, latency_ms=1.0, speedup_ratio=1.0
        )
        assert seconds == pytest.approx(256 * 1_835_008 / 25e9 + 0.001)

    def test_speedup_divides_and_zero_means_no_time(self) -> None:
        def seconds(blocks: int, speedup_ratio: float) -> float:
            return pull_seconds(
                blocks,
                block_bytes=1000,
                bandwidth_gbps=1.0,
                latency_ms=4.0,
                speedup_ratio=speedup_ratio,
            )

        assert seconds(1, 4.0) == pytest.approx((1e-6 + 0.004) / 4)
        assert seconds(1, 0.0) == 0.0
        assert seconds(0, 1.0) == 0.0

    def test_block_bytes_from_the_models_config(self, tmp_path: Path) -> None:
        assert kv_bytes_per_token(QWEN3_0_6B_CONFIG) == DEFAULT_KV_BYTES_PER_TOKEN == 114_688
        assert kv_bytes_per_token({**QWEN3_0_6B_CONFIG, "torch_dtype": "float32"}) == 229_376
        assert kv_bytes_per_token({"hidden_size": 64}) is None
        (tmp_path / "config.json").write_text(json.dumps({**QWEN3_0_6B_CONFIG, **TINY_QWEN3}))
        assert read_kv_bytes_per_token(tmp_path) == 2 * 2 * 2 * 16 * 4
        assert read_kv_bytes_per_token(tmp_path / "none") == DEFAULT_KV_BYTES_PER_TOKEN

    def test_named_blocks_is_the_leading_run_of_equal_hashes(self) -> None:
        params = handle([1, 2, 3], block_size=BS, block_bytes=1, dp_rank=0)
        assert named_blocks(params, [1, 2, 9, 4]) == 2
        assert named_blocks(params, [1]) == 1
        assert named_blocks({"block_hashes": [1]}, [1]) == 0
        assert named_blocks(None, [1]) == 0


def _run_one(engine: Engine, rid: str, prompt: tuple[int, ...]) -> None:
    engine.add(rid, prompt, _sampling())
    _run(engine)


def _steps(engine: Engine, count: int) -> list[Emission]:
    out: list[Emission] = []
    for _ in range(count):
        out.extend(engine.step().emissions)
    return out
