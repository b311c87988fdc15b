"""Mocker wiring: one NATS connection, the model's files and card, and ``num_workers`` workers.

Each worker (``worker.py``) has its own id, card, ``generate``/``cancel``/``kv_dump``
subscriptions, engine, engine-loop task and KV event sender; the KV-events stream is ensured
once per process before any worker publishes to it. ``python -m services.mocker`` runs a
``Mocker`` under ``shared.lifecycle.run_service``.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from services.mocker.config import MockerConfig
from services.mocker.metrics import MockerMetrics
from services.mocker.model import ModelInfo, load_model_info
from services.mocker.worker import MockWorker
from shared.kv_stream import ensure_kv_stream
from shared.messages import ModelCard
from shared.metrics import ServiceMetrics
from shared.registry import publish_model
from shared.subjects import Subjects

__all__ = ["MockWorker", "Mocker", "ModelInfo", "load_model_info"]


class Mocker:
    """All the workers of one process, sharing a connection, the model files and the corpus."""

    def __init__(
        self,
        config: MockerConfig,
        nc: Client,
        model: ModelInfo | None = None,
        metrics: MockerMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or MockerMetrics()
        self._nc = nc
        self._subjects = Subjects(config.namespace)
        self._model = model
        self.workers: list[MockWorker] = []

    @property
    def service_metrics(self) -> ServiceMetrics:
        return self.metrics.service

    async def start(self) -> None:
        """Publish the model's files and card, ensure the KV stream, start every worker."""
        model = self._model
        if model is None:
            model = self._model = await asyncio.to_thread(load_model_info, self.config)
        js = self._nc.jetstream()
        tool_parser, reasoning_parser = self.config.parsers()
        card = ModelCard(
            model=self.config.model_name,
            context_length=model.context_length,
            eos_token_ids=model.eos_token_ids,
            created=model.created,
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser,
        )
        replicas = self.config.js_replicas
        await publish_model(js, self._subjects, card, model.model_dir, replicas=replicas)
        await ensure_kv_stream(
            js,
            self._subjects,
            max_age_s=self.config.kv_stream_max_age_s,
            max_bytes=self.config.kv_stream_max_bytes,
            replicas=replicas,
        )
        for worker_id in self.config.worker_ids():
            worker = MockWorker(
                self._nc, self._subjects, self.config, model, worker_id, self.metrics
            )
            await worker.start()
            self.workers.append(worker)

    async def stop(self) -> None:
        """Stop every worker at once (each leaves the registry first)."""
        grace_s = self.config.shutdown_grace_s
        await asyncio.gather(*(w.stop(grace_s) for w in self.workers))
