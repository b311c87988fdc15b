"""The mocker with images (decision 032): its blocks holding an image's tokens hash the image in
as the preprocessor and router do, so its KV events match their lookups, the same image is a
cache hit and another image of the same size is not."""

from __future__ import annotations

from services.mocker.engine import Emission, Engine, EngineConfig
from shared.hashing import MmSpan, prefix_hashes
from shared.messages import AnyKvEvent, BlockStored, SamplingParams

CORPUS = tuple(range(1000, 1200))
BS = 4
PAD = 151655
PROMPT = (1, 2, 3, 4, 5, 6, *([PAD] * 8), 7, 8, 9)  # the image's tokens at 6..13
RED: list[MmSpan] = [(6, 8, 0xAAAA)]
BLUE: list[MmSpan] = [(6, 8, 0xBBBB)]


def _engine() -> Engine:
    return Engine(EngineConfig(speedup_ratio=0.0, block_size=BS, eos_token_ids=(7,)), CORPUS)


def _serve(engine: Engine, rid: str, images: list[MmSpan]) -> Emission:
    engine.add(rid, PROMPT, SamplingParams(max_tokens=1, ignore_eos=True), images=images)
    emissions: list[Emission] = []
    while engine.has_work:
        emissions += [e for e in engine.step().emissions if e.request_id == rid]
    return emissions[0]


def _stored(events: list[AnyKvEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


def test_published_hashes_are_the_preprocessor_s_with_the_image() -> None:
    engine = _engine()
    _serve(engine, "a", RED)
    stored = _stored(engine.take_kv_events())
    assert stored[:4] == prefix_hashes(PROMPT, BS, images=RED)


def test_the_same_image_again_is_a_cache_hit() -> None:
    engine = _engine()
    _serve(engine, "a", RED)
    assert _serve(engine, "b", RED).cached_tokens == 4 * BS


def test_another_image_of_the_same_size_reuses_only_the_blocks_before_it() -> None:
    engine = _engine()
    _serve(engine, "a", RED)
    assert _serve(engine, "b", BLUE).cached_tokens == 1 * BS  # block 0: tokens 1-4
