"""Tokenizers by model, loaded once from ``tokenizer.json`` bytes in the model registry.

Concurrent first requests for a model share one load; a failed load is not cached, so the next
request tries again. Parsing (~0.5 s for Qwen3) runs in a thread to keep the event loop free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from services.formatter.detokenizer import load_tokenizer
from shared.errors import InternalError, ModelNotFound
from shared.singleflight import SingleFlight

log = structlog.get_logger(__name__)

Fetch = Callable[[str], Awaitable[bytes | None]]
"""Model name -> its ``tokenizer.json`` bytes, or ``None`` when never published."""


class TokenizerCache:
    """One tokenizer per model; ``get`` loads it on first use."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._ready: dict[str, Any] = {}
        self._loading: SingleFlight[str, Any] = SingleFlight()

    def peek(self, model: str) -> Any | None:
        """The model's tokenizer if already loaded (no waiting)."""
        return self._ready.get(model)

    async def get(self, model: str) -> Any:
        """The model's tokenizer.

        Raises:
            ModelNotFound: no ``tokenizer.json`` was published for ``model``.
            InternalError: the file could not be fetched or parsed.
        """
        tokenizer = self._ready.get(model)
        if tokenizer is not None:
            return tokenizer
        return await self._loading.run(
            model, lambda: self._load(model), name=f"load-tokenizer-{model}"
        )

    async def _load(self, model: str) -> Any:
        try:
            data = await self._fetch(model)
        except Exception as exc:  # any registry failure becomes one typed error
            raise InternalError(f"cannot read the tokenizer of `{model}`: {exc}") from exc
        if data is None:
            raise ModelNotFound(model)
        try:
            tokenizer = await asyncio.to_thread(load_tokenizer, data)
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise InternalError(f"cannot parse the tokenizer of `{model}`: {exc}") from exc
        self._ready[model] = tokenizer
        log.info("tokenizer_loaded", model=model, size=len(data))
        return tokenizer
