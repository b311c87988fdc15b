"""The engine with its KV cache: prefix reuse, cached tokens, salts, preemption, timing, events."""

from __future__ import annotations

import pytest

from services.mocker.engine import Emission, Engine, EngineConfig
from services.mocker.sequence import next_sequence_hash
from services.mocker.timing import PolynomialTiming
from shared.hashing import local_block_hashes, prefix_hashes, salted_seed, sequence_hashes
from shared.messages import AnyKvEvent, BlockRemoved, BlockStored, SamplingParams

CORPUS = tuple(range(1000, 1200))
BS = 4


def _engine(**overrides: object) -> Engine:
    kwargs: dict[str, object] = {"speedup_ratio": 0.0, "block_size": BS, "eos_token_ids": (7,)}
    kwargs.update(overrides)
    return Engine(EngineConfig(**kwargs), CORPUS)  # type: ignore[arg-type]


def _run(engine: Engine) -> dict[str, list[Emission]]:
    out: dict[str, list[Emission]] = {}
    for _ in range(10_000):
        if not engine.has_work:
            return out
        for e in engine.step().emissions:
            out.setdefault(e.request_id, []).append(e)
    raise AssertionError("the engine never went idle")


def _serve(engine: Engine, rid: str, prompt: tuple[int, ...], **kwargs: object) -> Emission:
    """Run one request to the end; return its first emission."""
    sampling = SamplingParams(max_tokens=kwargs.pop("max_tokens", 3), ignore_eos=True)  # type: ignore[arg-type]
    engine.add(rid, prompt, sampling, **kwargs)  # type: ignore[arg-type]
    return _run(engine)[rid][0]


def _stored(events: list[AnyKvEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


PROMPT = tuple(range(1, 11))  # 10 tokens: 2 full blocks of 4


class TestPrefixReuse:
    def test_first_request_hits_nothing(self) -> None:
        assert _serve(_engine(), "a", PROMPT).cached_tokens == 0

    def test_second_request_reuses_the_full_shared_blocks(self) -> None:
        engine = _engine()
        _serve(engine, "a", PROMPT)
        first = _serve(engine, "b", (*PROMPT[:9], 99, 98, 97))
        assert first.cached_tokens == 2 * BS
        assert engine.stats.cache_hit_tokens == 2 * BS

    def test_a_fully_cached_prompt_still_computes_its_last_token(self) -> None:
        engine = _engine()
        _serve(engine, "a", PROMPT[:8])
        engine.add("b", PROMPT[:8], SamplingParams(max_tokens=1))
        out = engine.step()
        assert (out.emissions[0].cached_tokens, out.prefill_tokens) == (BS, BS)

    def test_cached_tokens_cost_no_prefill_time(self) -> None:
        timing = PolynomialTiming()
        engine = _engine(speedup_ratio=1.0)
        prompt = tuple(range(1, 42))
        engine.add("a", prompt, SamplingParams(max_tokens=1))
        cold = engine.step()
        engine.add("b", prompt, SamplingParams(max_tokens=1))
        warm = engine.step()
        assert cold.prefill_tokens == 41
        assert warm.prefill_tokens == 41 - 40
        assert cold.duration_s == pytest.approx(timing.prefill_ms(41) / 1000)
        assert warm.duration_s == pytest.approx(timing.prefill_ms(1) / 1000)

    def test_generated_blocks_become_cacheable(self) -> None:
        engine = _engine()
        engine.add("a", PROMPT[:4], SamplingParams(max_tokens=9, ignore_eos=True))
        output = [t for e in _run(engine)["a"] for t in e.token_ids]
        stored = _stored(engine.take_kv_events())
        assert stored == prefix_hashes((*PROMPT[:4], *output[:8]), BS)  # last token not computed
        assert _serve(engine, "b", (*PROMPT[:4], *output[:8], 5)).cached_tokens == 3 * BS

    def test_stored_hashes_are_what_the_router_computes(self) -> None:
        engine = _engine()
        _serve(engine, "a", PROMPT, hash_seed=salted_seed(cache_salt="t1"), max_tokens=1)
        events = [e for e in engine.take_kv_events() if isinstance(e, BlockStored)]
        assert list(events[0].block_hashes) == prefix_hashes(PROMPT, BS, cache_salt="t1")
        assert (events[0].parent_hash, events[0].token_ids) == (None, PROMPT[:8])

    def test_incremental_chain_matches_shared_hashing(self) -> None:
        tokens = list(range(50, 90))
        local = local_block_hashes(tokens, BS, seed=salted_seed(lora_name="x"))
        chained: list[int] = []
        for h in local:
            chained.append(next_sequence_hash(chained[-1] if chained else None, h))
        assert chained == sequence_hashes(local)


class TestSalts:
    def test_salted_requests_do_not_share(self) -> None:
        engine = _engine()
        _serve(engine, "a", PROMPT, hash_seed=salted_seed(cache_salt="tenant-a"))
        other = _serve(engine, "b", PROMPT, hash_seed=salted_seed(cache_salt="tenant-b"))
        plain = _serve(engine, "c", PROMPT)
        same = _serve(engine, "d", PROMPT, hash_seed=salted_seed(cache_salt="tenant-a"))
        assert (other.cached_tokens, plain.cached_tokens, same.cached_tokens) == (0, 0, 2 * BS)

    def test_lora_names_do_not_share(self) -> None:
        engine = _engine()
        _serve(engine, "a", PROMPT, hash_seed=salted_seed(lora_name="l1"), lora_name="l1")
        events = [e for e in engine.take_kv_events() if isinstance(e, BlockStored)]
        assert events[0].lora_name == "l1"
        assert _serve(engine, "b", PROMPT).cached_tokens == 0

    def test_without_prefix_caching_nothing_is_reused_or_published(self) -> None:
        engine = _engine(enable_prefix_caching=False)
        _serve(engine, "a", PROMPT)
        assert _serve(engine, "b", PROMPT).cached_tokens == 0
        assert engine.take_kv_events() == []


class TestMemoryPressure:
    def test_eviction_publishes_block_removed_in_lru_order(self) -> None:
        engine = _engine(num_gpu_blocks=4)
        _serve(engine, "a", (1, 2, 3, 4, 5, 6, 7, 8, 9), max_tokens=1)  # stores 2 blocks
        _serve(engine, "b", (11, 12, 13, 14, 15), max_tokens=1)  # stores 1 block
        a_hashes = prefix_hashes((1, 2, 3, 4, 5, 6, 7, 8), BS)
        engine.take_kv_events()
        _serve(engine, "c", tuple(range(20, 33)), max_tokens=1)  # needs 4 blocks: evicts 3
        removed = [e for e in engine.take_kv_events() if isinstance(e, BlockRemoved)]
        b_hash = prefix_hashes((11, 12, 13, 14), BS)[0]
        assert [h for e in removed for h in e.block_hashes] == [a_hashes[1], a_hashes[0], b_hash]

    def test_preemption_when_blocks_run_out_and_outputs_unchanged(self) -> None:
        prompts = {"a": tuple(range(1, 9)), "b": tuple(range(21, 29))}
        solo = {}
        for rid, prompt in prompts.items():
            engine = _engine()
            engine.add(rid, prompt, SamplingParams(max_tokens=10, ignore_eos=True))
            solo[rid] = [t for e in _run(engine)[rid] for t in e.token_ids]
        engine = _engine(num_gpu_blocks=6)  # each needs up to 5 blocks; together 10
        for rid, prompt in prompts.items():
            engine.add(rid, prompt, SamplingParams(max_tokens=10, ignore_eos=True))
        out = _run(engine)
        assert engine.stats.preemptions >= 1
        for rid in prompts:
            assert [t for e in out[rid] for t in e.token_ids] == solo[rid]
            assert [e.index for e in out[rid]] == list(range(10))
            assert out[rid][-1].finish_reason == "length"
        assert engine.cache.used_blocks == 0

    def test_a_request_larger_than_the_cache_stops_with_length(self) -> None:
        engine = _engine(num_gpu_blocks=2)  # 8 tokens in all
        engine.add("a", (1, 2, 3, 4, 5), SamplingParams(max_tokens=100, ignore_eos=True))
        emissions = _run(engine)["a"]
        assert (len(emissions), emissions[-1].finish_reason) == (4, "length")

    def test_chunked_prefill_counts_only_uncached_tokens_against_the_budget(self) -> None:
        engine = _engine(max_num_batched_tokens=16)
        prompt = tuple(range(1, 41))
        _serve(engine, "a", prompt)
        engine.add("b", (*prompt, 77, 78, 79), SamplingParams(max_tokens=1))
        out = engine.step()
        assert (out.prefill_tokens, len(out.emissions)) == (3, 1)  # 40 cached, 3 new

    def test_load_reports_queues_blocks_and_pending_prefill(self) -> None:
        engine = _engine(max_num_batched_tokens=8)
        engine.add("a", tuple(range(1, 21)), SamplingParams(max_tokens=2))
        engine.add("b", tuple(range(31, 36)), SamplingParams(max_tokens=2))
        load = engine.load()
        assert (load.active, load.waiting, load.prefill_tokens) == (0, 2, 25)
        engine.step()
        load = engine.load()
        assert (load.active, load.waiting, load.kv_used_blocks, load.prefill_tokens) == (
            1,
            1,
            2,
            17,
        )
