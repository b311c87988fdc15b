"""Tokenizer cache: one load per model, shared by concurrent first requests; failures retry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.formatter.tokenizer_cache import TokenizerCache
from shared.errors import InternalError, ModelNotFound
from shared.model_dir import ensure_default_model_dir


class FakeRegistry:
    """Serves ``tokenizer.json`` bytes by model; counts fetches."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.fetches = 0

    async def fetch(self, model: str) -> bytes | None:
        self.fetches += 1
        await asyncio.sleep(0)
        return self.files.get(model)


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    model_dir: Path = ensure_default_model_dir(tmp_path_factory.mktemp("qwen3"))
    return (model_dir / "tokenizer.json").read_bytes()


async def test_concurrent_first_loads_fetch_once(tokenizer_json: bytes) -> None:
    registry = FakeRegistry({"m": tokenizer_json})
    cache = TokenizerCache(registry.fetch)
    loaded = await asyncio.gather(*(cache.get("m") for _ in range(5)))
    assert registry.fetches == 1
    assert all(t is loaded[0] for t in loaded)
    assert cache.peek("m") is loaded[0]


async def test_unpublished_model_is_not_found() -> None:
    cache = TokenizerCache(FakeRegistry({}).fetch)
    with pytest.raises(ModelNotFound):
        await cache.get("missing")


async def test_a_failed_load_is_retried() -> None:
    registry = FakeRegistry({"m": b"not json"})
    cache = TokenizerCache(registry.fetch)
    for _ in range(2):
        with pytest.raises(InternalError, match="cannot parse"):
            await cache.get("m")
    assert registry.fetches == 2
