"""Mock media worker wiring: model cards, one worker card per model, ``MediaGenerate`` → files.

Each served model (an image model, a video model) gets a card without files (``kind="image"``
/ ``"video"``: gateways know which route serves it) and a worker card of its own
(``kind="media"``, ``<worker-id>-image`` / ``-video``) that says it is live. Gateways send
``MediaGenerate`` straight to ``subjects.media_generate(worker_id)`` (no preprocessor, router
or formatter: nothing is tokenized) and get ``MediaResult`` back on ``reply_to``; every failure
is a typed ``RequestFailed`` there (the shared handler boundary). The pictures are made on a
worker thread, so heartbeats and the routers' liveness probes are answered meanwhile. The start
and stop order is ``shared.worker.simple``'s.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence

from nats.aio.client import Client

from services.media.config import MediaConfig
from services.media.make import make
from shared import codec
from shared.errors import InvalidRequest, UpstreamTimeout
from shared.handlers import Callback
from shared.messages import MediaGenerate, MediaKind, ModelCard, WorkerCard, media_worker_id
from shared.metrics import ServiceMetrics
from shared.pings import answer_ping
from shared.worker.simple import Model, SimpleWorker

PAYLOAD_MARGIN = 16 * 1024
"""Room for the message's other fields under NATS' payload limit."""


def _reply_to(request: MediaGenerate) -> str:
    return request.reply_to


class MediaService(SimpleWorker[MediaConfig]):
    """One mock media worker: its cards in the registry and its request subscriptions."""

    def __init__(
        self, config: MediaConfig, nc: Client, *, metrics: ServiceMetrics | None = None
    ) -> None:
        super().__init__(config, nc, metrics=metrics)
        self.models: dict[str, MediaKind] = {}
        """Served model -> its kind."""
        self.worker_ids: dict[str, str] = {}
        """Served model -> the worker id it is registered under."""
        if config.image_model:
            self.models[config.image_model] = "image"
            self.worker_ids[config.image_model] = media_worker_id(config.worker_id, "image")
        if config.video_model:
            self.models[config.video_model] = "video"
            self.worker_ids[config.video_model] = media_worker_id(config.worker_id, "video")

    async def model_cards(self) -> Sequence[Model]:
        """A card without files per served model."""
        created = int(time.time())
        return [
            (ModelCard(model=model, context_length=0, created=created, kind=kind), None)
            for model, kind in self.models.items()
        ]

    def worker_cards(self) -> Sequence[WorkerCard]:
        return [
            WorkerCard(worker_id=worker_id, model=model, kind="media")
            for model, worker_id in self.worker_ids.items()
        ]

    def subscriptions(self) -> Sequence[tuple[str, Callback]]:
        on_generate = self.boundary.handler(
            codec.decoder(MediaGenerate), "media_generate", self.on_generate, reply_to=_reply_to
        )
        subjects = self._subjects
        return [
            (subject, callback)
            for worker_id in self.worker_ids.values()
            for subject, callback in (
                (subjects.media_generate(worker_id), on_generate),
                (subjects.worker_ping(worker_id), answer_ping),
            )
        ]

    def log_fields(self) -> dict[str, object]:
        return {"workers": self.worker_ids}

    async def on_generate(self, request: MediaGenerate) -> None:
        """Answer one request with its files (made on a worker thread)."""
        if request.deadline_ms and time.time() * 1000 > request.deadline_ms:
            raise UpstreamTimeout("the request expired before it reached the worker")
        worker_id = self.worker_ids.get(request.model, "")
        compute = functools.partial(make, request, models=self.models, worker_id=worker_id)
        result = await asyncio.to_thread(compute)
        data = codec.encode(result)
        if len(data) > self._nc.max_payload - PAYLOAD_MARGIN:
            raise InvalidRequest(
                f"The generated media ({len(data)} bytes) is larger than the message bus carries "
                f"({self._nc.max_payload} bytes); ask for fewer or smaller items.",
                param="n",
            )
        await self._nc.publish(request.reply_to, data)


def build_service(
    config: MediaConfig, nc: Client, *, metrics: ServiceMetrics | None = None
) -> MediaService:
    """Compose a mock media worker on ``nc``."""
    return MediaService(config, nc, metrics=metrics)
