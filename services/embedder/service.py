"""Mock embedding worker wiring: model card + files, worker card, ``EmbedTokens`` → vectors.

The model card (``kind="embedding"``) and the model's tokenizer files go to the registry, so
preprocessors tokenize its inputs and gateways know it is an embedding model; the worker card
(``kind="embedder"``) says it is live. Routers send ``EmbedTokens`` to
``subjects.embed_worker(worker_id)``; the answer goes to the request's ``reply_to``. A chat or
completion ``Generate`` routed here is answered with a 400 naming the embeddings API, and the
routers' liveness probes are answered like any worker's. The start and stop order is
``shared.worker.simple``'s.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from pathlib import Path

from nats.aio.client import Client

from services.embedder.answer import answer
from services.embedder.config import EmbedderConfig
from services.embedder.model import vector_size
from shared import codec
from shared.errors import InvalidRequest, ServiceError, UpstreamTimeout
from shared.handlers import Callback
from shared.messages import EmbedTokens, Generate, ModelCard, RequestPhase, WorkerCard
from shared.metrics import ServiceMetrics
from shared.model_dir import context_length, eos_token_ids
from shared.pings import answer_ping
from shared.worker.simple import Model, SimpleWorker

OFFLOAD_TOKENS = 4096
"""Requests with at least this many tokens are embedded on a worker thread (the heartbeat and
other requests keep going meanwhile)."""


def _reply_to(request: EmbedTokens) -> str:
    return request.reply_to


def _stream_to(gen: Generate) -> str:
    return gen.stream_to


def model_created(model_dir: Path) -> int:
    """The newest mtime of the model's files: the same for every worker of the model."""
    times = [p.stat().st_mtime for p in model_dir.iterdir() if p.is_file()]
    return int(max(times, default=0.0))


class EmbedderService(SimpleWorker[EmbedderConfig]):
    """One mock embedding worker: its cards in the registry and its request subscriptions."""

    def __init__(
        self, config: EmbedderConfig, nc: Client, *, metrics: ServiceMetrics | None = None
    ) -> None:
        super().__init__(config, nc, metrics=metrics)
        self.worker_id = config.worker_id
        self.size = config.embedding_size
        """Floats per vector; resolved from the model directory at start when 0."""

    async def model_cards(self) -> Sequence[Model]:
        """The model's card and files (the vector size is resolved here too)."""
        config = self.config
        model_dir = await asyncio.to_thread(config.resolved_model_dir)
        self.size = config.embedding_size or vector_size(model_dir)
        card = ModelCard(
            model=config.model_name,
            context_length=config.context_length or context_length(model_dir, default=32768),
            eos_token_ids=eos_token_ids(model_dir),
            created=model_created(model_dir),
            kind="embedding",
        )
        return [(card, model_dir)]

    def worker_cards(self) -> Sequence[WorkerCard]:
        model = self.config.model_name
        return [WorkerCard(worker_id=self.worker_id, model=model, kind="embedder")]

    def subscriptions(self) -> Sequence[tuple[str, Callback]]:
        on = self.boundary.handler
        on_embed = on(codec.decoder(EmbedTokens), "embed", self.on_embed, reply_to=_reply_to)
        on_generate = on(
            codec.decoder(Generate),
            "generate",
            self.on_generate,
            reply_to=_stream_to,
            after_failure=self._finished,
        )
        subjects = self._subjects
        return [
            (subjects.embed_worker(self.worker_id), on_embed),
            (subjects.generate(self.worker_id), on_generate),
            (subjects.worker_ping(self.worker_id), answer_ping),
        ]

    def log_fields(self) -> dict[str, object]:
        return {"worker_id": self.worker_id, "model": self.config.model_name, "size": self.size}

    async def on_embed(self, request: EmbedTokens) -> None:
        """Answer one request with its vectors (large ones computed off the event loop)."""
        if request.deadline_ms and time.time() * 1000 > request.deadline_ms:
            raise UpstreamTimeout("the request expired before it reached the worker")
        compute = functools.partial(
            answer,
            request,
            model=self.config.model_name,
            size=self.size,
            worker_id=self.worker_id,
        )
        tokens = sum(len(ids) for ids in request.token_ids)
        result = await asyncio.to_thread(compute) if tokens >= OFFLOAD_TOKENS else compute()
        await self._nc.publish(request.reply_to, codec.encode(result))

    async def on_generate(self, gen: Generate) -> None:
        """An embedding model generates no text: 400, naming the API to use."""
        raise InvalidRequest(
            f"The model `{gen.model}` is an embedding model: use /v1/embeddings.",
            param="model",
        )

    async def _finished(self, gen: Generate, _: ServiceError) -> None:
        """Routers count a routed ``Generate`` until its worker says it finished."""
        phase = RequestPhase(
            request_id=gen.request_id, worker_id=self.worker_id, phase="finished", ts=time.time()
        )
        await self._nc.publish(self._subjects.lifecycle(self.worker_id), codec.encode(phase))


def build_service(
    config: EmbedderConfig, nc: Client, *, metrics: ServiceMetrics | None = None
) -> EmbedderService:
    """Compose a mock embedding worker on ``nc``."""
    return EmbedderService(config, nc, metrics=metrics)
