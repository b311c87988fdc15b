"""The reader side of model files: ``ModelFiles`` reads cards and files from the models object
store and caches them; once ``watch()``ed it follows the store, so a model republished with
another card (a worker upgraded with new inputs) is read afresh.
"""

from __future__ import annotations

from nats.js.client import JetStreamContext
from nats.js.object_store import ObjectStore

from shared import codec
from shared.messages import ModelCard
from shared.registry.disk_cache import DiskCache
from shared.registry.jetstream import object_digest, read_object
from shared.registry.layout import CARD, models_store, object_name
from shared.registry.store_watch import StoreWatch
from shared.subjects import Subjects

DISK_CACHE_MIN_BYTES = 64 * 1024
"""Small files (cards, configs) are read from the store each time: caching them saves nothing."""


class ModelFiles:
    """Reads model cards and files from the object store; caches them per model.

    Unwatched, a file once read is kept for good. Watched (``watch()``), a file is kept until
    the store says its object changed, and everything is dropped whenever the watch starts
    again (changes made meanwhile were not seen). A read that a change overtakes is returned
    but not kept.
    """

    def __init__(
        self, js: JetStreamContext, subjects: Subjects, *, disk: DiskCache | None = None
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._store: ObjectStore | None = None
        self._cache: dict[tuple[str, str], bytes] = {}
        self._cards: dict[str, ModelCard] = {}
        """Decoded cards, dropped with their bytes."""
        self._disk = disk or DiskCache()
        self._changes: dict[str, int] = {}
        """Per model: changes seen (a read that began before one is not cached)."""
        self._resets = 0
        """Times everything was dropped at once."""
        self._watch: StoreWatch | None = None

    async def watch(self) -> None:
        """Follow the store from now on (``stop()`` ends it)."""
        self._watch = StoreWatch(
            self._js, self._subjects.models_store, on_change=self.changed, on_reset=self.reset
        )
        await self._watch.start()

    async def stop(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch.stop()

    async def get(self, model: str, file: str) -> bytes | None:
        """One file of a model (``None`` if the model or the file was never published)."""
        key = (model, file)
        if key in self._cache:
            return self._cache[key]
        seen = self._revision(model)
        if self._store is None:
            self._store = await models_store(self._js, self._subjects)
        name = object_name(model, file)
        digest = await object_digest(self._store, name)
        if digest is None:
            return None
        data = self._disk.get(digest)
        if data is None:
            data = await read_object(self._store, name)
            if data is not None and len(data) >= DISK_CACHE_MIN_BYTES:
                self._disk.put(data)
        if data is not None and self._revision(model) == seen:
            self._cache[key] = data
        return data

    async def card(self, model: str) -> ModelCard | None:
        """The model's card, or ``None`` if no worker ever published this model."""
        card = self._cards.get(model)
        if card is not None:
            return card
        seen = self._revision(model)
        data = await self.get(model, CARD)
        if not data:
            return None
        card = codec.decode(data, ModelCard)
        if self._revision(model) == seen:
            self._cards[model] = card
        return card

    def changed(self, name: str) -> None:
        """The store's object ``name`` (``<model>/<file>``) was put or deleted: drop it."""
        model, _, file = name.rpartition("/")
        self._changes[model] = self._changes.get(model, 0) + 1
        self._cache.pop((model, file), None)
        if file == CARD:
            self._cards.pop(model, None)

    def reset(self) -> None:
        """Drop every cached file (what changed while nothing watched is unknown)."""
        self._resets += 1
        self._cache.clear()
        self._cards.clear()

    def forget(self, model: str) -> None:
        """Drop a model's cached files (after a worker republished them)."""
        self._changes[model] = self._changes.get(model, 0) + 1
        self._cards.pop(model, None)
        for key in [k for k in self._cache if k[0] == model]:
            del self._cache[key]

    def _revision(self, model: str) -> tuple[int, int]:
        return self._resets, self._changes.get(model, 0)
