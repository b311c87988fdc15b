"""The reader side: live worker cards (``WorkerDirectory``) and model files (``ModelFiles``).

A directory watches the workers bucket and expires cards by TTL locally, because max-age
expiry sends watchers nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from shared import codec
from shared.messages import ModelCard, WorkerCard
from shared.registry.jetstream import read_object
from shared.registry.layout import (
    CARD,
    DEFAULT_WORKER_TTL_S,
    models_store,
    object_name,
    workers_bucket,
)
from shared.subjects import Subjects

log = structlog.get_logger(__name__)


def is_live(card: WorkerCard, now: float, ttl_s: float) -> bool:
    """A card is live while its last heartbeat is younger than the TTL."""
    return now - card.heartbeat_at < ttl_s


@dataclass
class LiveWorkers:
    """Worker cards seen so far, by id. Pure: the clock is passed in."""

    ttl_s: float
    cards: dict[str, WorkerCard] = field(default_factory=dict)

    def put(self, card: WorkerCard) -> None:
        self.cards[card.worker_id] = card

    def remove(self, worker_id: str) -> WorkerCard | None:
        return self.cards.pop(worker_id, None)

    def for_model(self, model: str, now: float) -> list[WorkerCard]:
        """Live workers serving ``model``, ordered by worker id (stable for round-robin)."""
        return sorted(
            (c for c in self.cards.values() if c.model == model and is_live(c, now, self.ttl_s)),
            key=lambda c: c.worker_id,
        )

    def models(self, now: float) -> set[str]:
        """Models with at least one live worker."""
        return {c.model for c in self.cards.values() if is_live(c, now, self.ttl_s)}


class WorkerDirectory:
    """Keeps a ``LiveWorkers`` view in sync with the workers bucket through a KV watch."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        *,
        ttl_s: float = DEFAULT_WORKER_TTL_S,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._clock = clock
        self._on_change = on_change
        self.view = LiveWorkers(ttl_s=ttl_s)
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        """Open the bucket and start watching; returns once the initial values are loaded."""
        kv = await workers_bucket(self._js, self._subjects, self.view.ttl_s)
        watcher = await kv.watchall()
        self._task = asyncio.create_task(self._watch(watcher), name="worker-directory")
        await asyncio.wait_for(self._ready.wait(), timeout=10)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is None:  # end of the initial values
                self._ready.set()
                continue
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                if self.view.remove(entry.key) is not None:
                    log.info("worker_deregistered", worker_id=entry.key)
            else:
                card = codec.decode(entry.value, WorkerCard)
                if card.worker_id not in self.view.cards:
                    log.info("worker_registered", worker_id=card.worker_id, model=card.model)
                self.view.put(card)
            self._ready.set()
            if self._on_change is not None:
                self._on_change()

    def live(self, model: str) -> list[WorkerCard]:
        """Live workers for ``model`` right now."""
        return self.view.for_model(model, self._clock())

    def models(self) -> set[str]:
        """Models with at least one live worker right now."""
        return self.view.models(self._clock())


class ModelFiles:
    """Reads model cards and files from the object store; caches them per model."""

    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._store: ObjectStore | None = None
        self._cache: dict[tuple[str, str], bytes] = {}

    async def get(self, model: str, file: str) -> bytes | None:
        """One file of a model (``None`` if the model or the file was never published)."""
        key = (model, file)
        if key in self._cache:
            return self._cache[key]
        if self._store is None:
            self._store = await models_store(self._js, self._subjects)
        data = await read_object(self._store, object_name(model, file))
        if data is not None:
            self._cache[key] = data
        return data

    async def card(self, model: str) -> ModelCard | None:
        """The model's card, or ``None`` if no worker ever published this model."""
        data = await self.get(model, CARD)
        return codec.decode(data, ModelCard) if data else None

    def forget(self, model: str) -> None:
        """Drop a model's cached files (after a worker republished them)."""
        for key in [k for k in self._cache if k[0] == model]:
            del self._cache[key]
