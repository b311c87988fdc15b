"""The per-model asset cache: one load per model, unknown models not cached, LRU eviction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from services.preprocessor.assets import AssetCache
from services.preprocessor.tokenizer import ModelAssets
from shared.errors import ModelNotFound
from shared.messages import ModelCard


class FakeFiles:
    """A registry holding the Qwen files under any number of model names."""

    def __init__(self, files: dict[str, bytes], models: set[str]) -> None:
        self.files = files
        self.models = models
        self.card_reads: list[str] = []
        self.forgotten: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def card(self, model: str) -> ModelCard | None:
        self.card_reads.append(model)
        await self.gate.wait()
        if model not in self.models:
            return None
        return ModelCard(model=model, context_length=1024, eos_token_ids=(151645,))

    async def get(self, model: str, file: str) -> bytes | None:
        return self.files.get(file)

    def forget(self, model: str) -> None:
        self.forgotten.append(model)


async def inline(build: Callable[[], ModelAssets]) -> ModelAssets:
    return build()


async def test_concurrent_first_requests_load_once(qwen_files: dict[str, bytes]) -> None:
    files = FakeFiles(qwen_files, {"m"})
    files.gate.clear()
    cache = AssetCache(files, offload=inline)
    waiters = [asyncio.create_task(cache.get("m")) for _ in range(5)]
    await asyncio.sleep(0)  # let every waiter reach the shared load
    files.gate.set()
    results = await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert (len(files.card_reads), len({id(r) for r in results})) == (1, 1)


async def test_unknown_model_is_not_found_and_not_cached(qwen_files: dict[str, bytes]) -> None:
    files = FakeFiles(qwen_files, set())
    cache = AssetCache(files, offload=inline)
    with pytest.raises(ModelNotFound):
        await cache.get("late")
    files.models.add("late")
    assert (await cache.get("late")).model == "late"


async def test_least_recently_used_model_is_evicted(qwen_files: dict[str, bytes]) -> None:
    cache = AssetCache(FakeFiles(qwen_files, {"a", "b", "c"}), max_models=2, offload=inline)
    await cache.get("a")
    await cache.get("b")
    await cache.get("a")
    await cache.get("c")
    assert cache.loaded() == ["a", "c"]


async def test_max_model_len_applies_to_loaded_models(qwen_files: dict[str, bytes]) -> None:
    cache = AssetCache(FakeFiles(qwen_files, {"m"}), max_model_len=512, offload=inline)
    assert (await cache.get("m")).context_length == 512


async def test_raw_files_are_dropped_once_parsed(qwen_files: dict[str, bytes]) -> None:
    files = FakeFiles(qwen_files, {"m"})
    await AssetCache(files, offload=inline).get("m")
    assert files.forgotten == ["m"]
