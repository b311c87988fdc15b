"""Per-model asset cache: load each model's tokenizer once, even under concurrent first requests.

Files come from the model registry (``shared.registry.ModelFiles`` in production, a fake in
tests). A model with no card is ``ModelNotFound`` and is never cached, so a model published
later is found on its next request. The least recently used model is dropped past the limit.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from services.preprocessor.tokenizer import WANTED_FILES, ModelAssets, load_assets
from shared.errors import ModelNotFound
from shared.messages import ModelCard
from shared.singleflight import SingleFlight

log = structlog.get_logger(__name__)

Offload = Callable[[Callable[[], ModelAssets]], Awaitable[ModelAssets]]
"""Runs a CPU-bound builder off the event loop (``asyncio.to_thread`` in production)."""


class FileSource(Protocol):
    """Where model cards and files come from (the registry's object store)."""

    async def card(self, model: str) -> ModelCard | None: ...

    async def get(self, model: str, file: str) -> bytes | None: ...

    def forget(self, model: str) -> None:
        """Drop any cached bytes of ``model`` (we keep the parsed tokenizer instead)."""


async def _to_thread(build: Callable[[], ModelAssets]) -> ModelAssets:
    return await asyncio.to_thread(build)


class AssetCache:
    """Model name → ``ModelAssets``; one load per model at a time, failures not cached."""

    def __init__(
        self,
        files: FileSource,
        *,
        max_model_len: int = 0,
        max_models: int = 8,
        offload: Offload = _to_thread,
    ) -> None:
        self._files = files
        self._max_model_len = max_model_len
        self._max_models = max_models
        self._offload = offload
        self._ready: OrderedDict[str, ModelAssets] = OrderedDict()
        self._loading: SingleFlight[str, ModelAssets] = SingleFlight()

    async def get(self, model: str) -> ModelAssets:
        """The model's assets, loading them on first use.

        Raises:
            ModelNotFound: no worker ever published this model.
            InternalError: its files are missing or broken.
        """
        assets = self._ready.get(model)
        if assets is not None:
            self._ready.move_to_end(model)
            return assets
        return await self._loading.run(
            model, lambda: self._load(model), name=f"load-assets-{model}"
        )

    async def close(self) -> None:
        """Cancel loads still running (at shutdown, when no request waits for them)."""
        await self._loading.cancel_all()

    def loaded(self) -> list[str]:
        """Names of the models whose assets are in memory, least recently used first."""
        return list(self._ready)

    async def _load(self, model: str) -> ModelAssets:
        card = await self._files.card(model)
        if card is None:
            raise ModelNotFound(model)
        names = [f for f in WANTED_FILES if not card.files or f in card.files]
        blobs = await asyncio.gather(*(self._files.get(model, f) for f in names))
        files = {name: blob for name, blob in zip(names, blobs, strict=True) if blob}
        loop = asyncio.get_running_loop()
        started = loop.time()
        assets = await self._offload(
            lambda: load_assets(card, files, max_model_len=self._max_model_len)
        )
        self._files.forget(model)  # ~11 MB of tokenizer.json per model, now parsed
        log.info(
            "model_assets_loaded",
            model=model,
            context_length=assets.context_length,
            vocab_size=assets.vocab_size,
            has_chat_template=bool(assets.chat_templates),
            load_ms=round((loop.time() - started) * 1000, 1),
        )
        self._ready[model] = assets
        while len(self._ready) > self._max_models:
            evicted, _ = self._ready.popitem(last=False)
            log.info("model_assets_evicted", model=evicted)
        return assets
