"""The simulated engine: deterministic tokens, finish reasons, cancellation, batching limits."""

from __future__ import annotations

import pytest

from services.mocker.engine import Emission, Engine, EngineConfig, EngineError
from services.mocker.timing import PolynomialTiming
from shared.messages import SamplingParams

CORPUS = tuple(range(1000, 1200))  # 200 distinct "tokens"; never an EOS or a test stop id
EOS = 7


def _engine(**overrides: object) -> Engine:
    kwargs: dict[str, object] = {"speedup_ratio": 0.0, "eos_token_ids": (EOS,)}
    kwargs.update(overrides)
    return Engine(EngineConfig(**kwargs), CORPUS)  # type: ignore[arg-type]


def _run(engine: Engine, max_steps: int = 10_000) -> dict[str, list[Emission]]:
    out: dict[str, list[Emission]] = {}
    for _ in range(max_steps):
        if not engine.has_work:
            return out
        for e in engine.step().emissions:
            out.setdefault(e.request_id, []).append(e)
    raise AssertionError("the engine never went idle")


def _tokens(emissions: list[Emission]) -> list[int]:
    return [t for e in emissions for t in e.token_ids]


def _generate(
    engine: Engine, sampling: SamplingParams, prompt: tuple[int, ...] = (1, 2, 3)
) -> tuple[list[int], Emission]:
    engine.add("r", prompt, sampling)
    emissions = _run(engine)["r"]
    return _tokens(emissions), emissions[-1]


class TestDeterminism:
    def test_same_seed_and_prompt_give_the_same_tokens(self) -> None:
        a, _ = _generate(_engine(seed=1), SamplingParams(max_tokens=20))
        b, _ = _generate(_engine(seed=1), SamplingParams(max_tokens=20))
        assert a == b

    def test_output_is_a_corpus_slice_starting_in_the_first_half(self) -> None:
        tokens, _ = _generate(_engine(seed=1), SamplingParams(max_tokens=20))
        start = CORPUS.index(tokens[0])
        assert start < len(CORPUS) // 2
        assert tokens == list(CORPUS[start : start + 20])

    def test_request_seed_overrides_the_prompt_hash(self) -> None:
        engine = _engine(seed=1)
        sampling = SamplingParams(seed=42)
        assert engine.start_offset((1, 2), sampling) == engine.start_offset((9, 9, 9), sampling)

    def test_different_prompts_start_at_different_offsets(self) -> None:
        engine = _engine(seed=1)
        offsets = {engine.start_offset((i, i + 1), SamplingParams()) for i in range(20)}
        assert len(offsets) > 5

    def test_engine_seed_changes_the_output(self) -> None:
        offsets = {_engine(seed=s).start_offset((1, 2, 3), SamplingParams()) for s in range(20)}
        assert len(offsets) > 5


class TestFinish:
    def test_max_tokens_finishes_with_length(self) -> None:
        tokens, last = _generate(_engine(), SamplingParams(max_tokens=5))
        assert (len(tokens), last.finish_reason, last.stop_token_id) == (5, "length", None)

    def test_corpus_end_emits_eos_and_stops(self) -> None:
        tokens, last = _generate(_engine(), SamplingParams(max_tokens=1000, stop_token_ids=(EOS,)))
        assert (last.finish_reason, last.stop_token_id, tokens[-1]) == ("stop", EOS, EOS)
        assert tokens[-2] == CORPUS[-1]

    def test_model_eos_is_used_when_the_request_names_none(self) -> None:
        _, last = _generate(_engine(), SamplingParams(max_tokens=1000))
        assert (last.finish_reason, last.stop_token_id) == ("stop", EOS)

    def test_first_stop_token_id_is_the_eos_at_corpus_end(self) -> None:
        _, last = _generate(_engine(), SamplingParams(max_tokens=1000, stop_token_ids=(99, EOS)))
        assert last.stop_token_id == 99

    def test_ignore_eos_wraps_around_to_max_tokens(self) -> None:
        tokens, last = _generate(_engine(), SamplingParams(max_tokens=450, ignore_eos=True))
        assert (len(tokens), last.finish_reason) == (450, "length")
        assert EOS not in tokens

    def test_stop_token_id_in_the_output_ends_with_stop(self) -> None:
        first, _ = _generate(_engine(seed=3), SamplingParams(max_tokens=10))
        stop = first[4]
        tokens, last = _generate(
            _engine(seed=3), SamplingParams(max_tokens=10, stop_token_ids=(EOS, stop))
        )
        assert tokens == first[:5]
        assert (last.finish_reason, last.stop_token_id) == ("stop", stop)

    def test_min_tokens_suppresses_stop_ids_until_reached(self) -> None:
        first, _ = _generate(_engine(seed=3), SamplingParams(max_tokens=10))
        stop = first[2]
        sampling = SamplingParams(max_tokens=10, min_tokens=5, stop_token_ids=(stop,))
        tokens, last = _generate(_engine(seed=3), sampling)
        assert stop not in tokens
        assert (len(tokens), last.finish_reason) == (10, "length")

    def test_min_tokens_runs_past_the_corpus_end(self) -> None:
        sampling = SamplingParams(max_tokens=1000, min_tokens=300, stop_token_ids=(EOS,))
        tokens, last = _generate(_engine(), sampling)
        assert len(tokens) > 300
        assert (last.finish_reason, tokens[-1]) == ("stop", EOS)

    def test_first_emission_carries_prompt_tokens_and_index(self) -> None:
        engine = _engine()
        engine.add("r", (1, 2, 3, 4), SamplingParams(max_tokens=3))
        emissions = _run(engine)["r"]
        assert [(e.index, e.prompt_tokens) for e in emissions] == [(0, 4), (1, 0), (2, 0)]


class TestCancel:
    def test_cancel_frees_the_request_and_reports_cancelled(self) -> None:
        engine = _engine()
        engine.add("r", (1, 2, 3), SamplingParams(max_tokens=100))
        engine.step()
        engine.step()
        emission = engine.cancel("r")
        assert emission is not None
        assert (emission.finish_reason, emission.index, emission.token_ids) == ("cancelled", 2, ())
        assert not engine.has_work
        assert "r" not in engine

    def test_cancel_of_a_waiting_request(self) -> None:
        engine = _engine()
        engine.add("r", (1, 2, 3), SamplingParams())
        assert engine.cancel("r") is not None
        assert not engine.has_work

    def test_cancel_of_an_unknown_request_is_ignored(self) -> None:
        assert _engine().cancel("nope") is None


class TestBatching:
    def test_running_requests_never_exceed_max_num_seqs(self) -> None:
        engine = _engine(max_num_seqs=3)
        for i in range(10):
            engine.add(f"r{i}", (1, 2, 3), SamplingParams(max_tokens=4))
        seen = []
        while engine.has_work:
            engine.step()
            seen.append(engine.num_running)
        assert max(seen) == 3

    def test_each_step_respects_the_token_budget(self) -> None:
        engine = _engine(max_num_batched_tokens=64)
        for i in range(5):  # distinct prompts: no prefix-cache hits
            engine.add(
                f"r{i}", tuple(range(100 * i + 1, 100 * i + 41)), SamplingParams(max_tokens=3)
            )
        steps = []
        while engine.has_work:
            out = engine.step()
            steps.append(out.prefill_tokens + out.decode_seqs)
        assert max(steps) <= 64
        assert sum(1 for s in steps if s == 64) >= 2  # the budget is actually used

    def test_long_prompt_is_prefilled_in_chunks(self) -> None:
        engine = _engine(max_num_batched_tokens=100)
        engine.add("r", tuple(range(1, 251)), SamplingParams(max_tokens=1))
        outputs = [engine.step() for _ in range(3)]
        assert [o.prefill_tokens for o in outputs] == [100, 100, 50]
        assert [len(o.emissions) for o in outputs] == [0, 0, 1]

    def test_decodes_advance_one_token_per_step_together(self) -> None:
        engine = _engine()
        engine.add("a", (1, 2), SamplingParams(max_tokens=3))
        engine.add("b", (3, 4), SamplingParams(max_tokens=3))
        counts = []
        while engine.has_work:
            counts.append(len(engine.step().emissions))
        assert counts == [2, 2, 2]

    def test_admission_waits_for_kv_blocks(self) -> None:
        engine = _engine(block_size=4, num_gpu_blocks=4)
        engine.add("a", tuple(range(1, 11)), SamplingParams(max_tokens=2))  # 3 blocks
        engine.add("b", tuple(range(21, 31)), SamplingParams(max_tokens=2))  # 3 other blocks
        engine.step()
        assert (engine.num_running, engine.num_waiting) == (1, 1)
        assert set(_run(engine)) == {"a", "b"}

    def test_same_step_admission_reuses_the_blocks_just_scheduled(self) -> None:
        # As vLLM v1: blocks are cacheable once scheduled, so a request admitted right after
        # another with the same prefix, in the same step, computes only its own suffix.
        engine = _engine(block_size=4, num_gpu_blocks=8)
        prefix = tuple(range(1, 13))  # 3 full blocks
        engine.add("a", (*prefix, 50, 51), SamplingParams(max_tokens=1))
        engine.add("b", (*prefix, 60, 61), SamplingParams(max_tokens=1))
        out = engine.step()
        assert out.prefill_tokens == 14 + 2
        cached = {e.request_id: e.cached_tokens for e in out.emissions}
        assert cached == {"a": 0, "b": 12}

    def test_a_request_behind_a_chunked_prefill_reuses_its_last_chunk_in_the_same_step(
        self,
    ) -> None:
        engine = _engine(block_size=4, num_gpu_blocks=16, max_num_batched_tokens=10)
        prefix = tuple(range(1, 17))  # 4 full blocks
        engine.add("a", (*prefix, 50), SamplingParams(max_tokens=1))
        engine.add("b", (*prefix, 60), SamplingParams(max_tokens=1))
        first = engine.step()  # a: tokens 0-9 take the whole budget; b waits
        assert (first.prefill_tokens, first.emissions) == (10, [])
        second = engine.step()  # a: tokens 10-16 (blocks 2-3), then b: all 4 blocks + 1 token
        assert second.prefill_tokens == 7 + 1
        assert {e.request_id: e.cached_tokens for e in second.emissions} == {"a": 0, "b": 16}

    def test_prompt_larger_than_the_kv_cache_is_rejected(self) -> None:
        engine = _engine(block_size=4, num_gpu_blocks=2)
        with pytest.raises(EngineError, match="KV cache"):
            engine.add("r", tuple(range(1, 20)), SamplingParams())

    def test_empty_prompt_is_rejected(self) -> None:
        with pytest.raises(EngineError, match="at least one token"):
            _engine().add("r", (), SamplingParams())


class TestDuration:
    def test_no_sleeping_at_speedup_zero(self) -> None:
        engine = _engine(speedup_ratio=0.0)
        engine.add("r", (1, 2, 3), SamplingParams())
        assert engine.step().duration_s == 0.0

    def test_speedup_divides_the_step_time(self) -> None:
        durations = []
        for ratio in (1.0, 10.0):
            engine = _engine(speedup_ratio=ratio)
            engine.add("r", tuple(range(1, 101)), SamplingParams())
            durations.append(engine.step().duration_s)
        assert durations[0] == pytest.approx(10 * durations[1])
        assert durations[0] > 0

    def test_prefill_part_of_a_mixed_step(self) -> None:
        timing = PolynomialTiming()
        engine = _engine(speedup_ratio=1.0)
        engine.add("a", tuple(range(1, 101)), SamplingParams(max_tokens=4))
        engine.step()  # a's prefill
        engine.add("b", tuple(range(201, 251)), SamplingParams(max_tokens=4))
        out = engine.step()  # b's prefill + a's decode
        assert out.prefill_s == pytest.approx(timing.prefill_ms(50) / 1000)
        assert out.duration_s > out.prefill_s

    @pytest.mark.parametrize("first_token_decodes", [False, True])
    def test_a_step_completing_a_prefill_pays_decode_as_dynamo(
        self, first_token_decodes: bool
    ) -> None:
        """Dynamo's mocker generates the first token in the decode phase of the same step."""
        timing = PolynomialTiming()
        engine = _engine(speedup_ratio=1.0, first_token_decodes=first_token_decodes)
        engine.add("r", tuple(range(1, 101)), SamplingParams(max_tokens=4))
        out = engine.step()
        assert out.prefill_s == pytest.approx(timing.prefill_ms(100) / 1000)
        decode_s = timing.decode_ms(100, engine.config.kv_capacity_tokens) / 1000
        extra = decode_s if first_token_decodes else 0.0
        assert out.duration_s == pytest.approx(out.prefill_s + extra)

    def test_decode_time_counts_the_kv_of_the_decoding_requests_only(self) -> None:
        """A request completing its prefill in a step adds prefill time, not decode KV."""
        timing = PolynomialTiming()
        engine = _engine(speedup_ratio=1.0, num_gpu_blocks=64)  # 1024 tokens of KV
        engine.add("a", tuple(range(1, 101)), SamplingParams(max_tokens=8, ignore_eos=True))
        engine.step()  # a: prefill, first token
        engine.add("b", tuple(range(201, 601)), SamplingParams(max_tokens=8, ignore_eos=True))
        out = engine.step()  # b: 400-token prefill; a: one decode over its 101 tokens
        expected = timing.prefill_ms(400) + timing.decode_ms(101, 1024)
        assert out.duration_s == pytest.approx(expected / 1000)
        out = engine.step()  # both decode: 102 + 401 tokens
        assert out.duration_s == pytest.approx(timing.decode_ms(102 + 401, 1024) / 1000)

    def test_a_chunk_that_completes_no_prefill_pays_no_decode(self) -> None:
        engine = _engine(speedup_ratio=1.0, max_num_batched_tokens=64, first_token_decodes=True)
        engine.add("r", tuple(range(1, 101)), SamplingParams(max_tokens=4))
        out = engine.step()  # 64 of 100 prompt tokens: no token yet
        assert not out.emissions
        assert out.duration_s == pytest.approx(out.prefill_s)
