"""A request/reply worker with no engine (tensor echo, embeddings, media): the ``Service`` that
``run_service`` runs for it.

It owns what every such worker repeats: its metrics (``ServiceMetrics(config.SERVICE)``), its
handler boundary, its model cards (and files) in the registry, its worker cards and its
subscriptions (``presence.WorkerPresence``). ``start`` publishes the model cards, subscribes,
then registers (a worker card means "ready"); ``stop`` leaves the registry, then unsubscribes:
each request is answered as it comes, so nothing is in flight to drain. A service subclasses it
and says, in ``model_cards``, ``worker_cards`` and ``subscriptions``, what it serves and where.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

import structlog
from nats.aio.client import Client

from shared.handlers import Boundary, Callback
from shared.messages import ModelCard, WorkerCard
from shared.metrics import ServiceMetrics
from shared.registry import publish_model, publish_model_card
from shared.subjects import Subjects
from shared.worker.presence import WorkerPresence

log = structlog.get_logger(__name__)


class SimpleWorkerConfig(Protocol):
    """What ``SimpleWorker`` reads of a worker's settings."""

    SERVICE: ClassVar[str]

    @property
    def namespace(self) -> str: ...

    @property
    def js_replicas(self) -> int: ...

    @property
    def worker_ttl_s(self) -> float: ...


C = TypeVar("C", bound=SimpleWorkerConfig)

Model = tuple[ModelCard, Path | None]
"""A served model's card and the directory whose files go with it (None: a card alone)."""


class SimpleWorker(Generic[C]):
    """One request/reply worker process: its cards in the registry and its subscriptions."""

    def __init__(self, config: C, nc: Client, *, metrics: ServiceMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or ServiceMetrics(config.SERVICE)
        self._nc = nc
        self._subjects = Subjects(config.namespace)
        self.boundary = Boundary(nc, self.metrics)
        self._presence = WorkerPresence(
            nc, self._subjects, ttl_s=config.worker_ttl_s, replicas=config.js_replicas
        )

    @property
    def service_metrics(self) -> ServiceMetrics:
        return self.metrics

    # --- what a worker says about itself -------------------------------------------------------

    async def model_cards(self) -> Sequence[Model]:
        """The served models' cards, each with its files' directory (None: a card alone)."""
        raise NotImplementedError

    def worker_cards(self) -> Sequence[WorkerCard]:
        """The cards saying this worker is live (one per worker id it answers for)."""
        raise NotImplementedError

    def subscriptions(self) -> Sequence[tuple[str, Callback]]:
        """``(subject, callback)`` in subscription order (callbacks on ``self.boundary``)."""
        raise NotImplementedError

    def log_fields(self) -> dict[str, object]:
        """What ``worker_started`` and ``worker_stopped`` say about this worker."""
        raise NotImplementedError

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Publish the model cards (and files), subscribe, then register (a worker card means
        "ready")."""
        js = self._nc.jetstream()
        replicas = self.config.js_replicas
        for card, model_dir in await self.model_cards():
            if model_dir is None:
                await publish_model_card(js, self._subjects, card, replicas=replicas)
            else:
                await publish_model(js, self._subjects, card, model_dir, replicas=replicas)
        for subject, callback in self.subscriptions():
            await self._presence.subscribe(subject, callback)
        for worker_card in self.worker_cards():
            self._presence.add_card(worker_card)
        await self._presence.announce()  # subscribed on the server before a card says "ready"
        log.info("worker_started", **self.log_fields())

    async def stop(self) -> None:
        """Leave the registry, then stop taking requests (each is answered as it comes)."""
        await self._presence.withdraw()
        await self._presence.unsubscribe()
        log.info("worker_stopped", **self.log_fields())
