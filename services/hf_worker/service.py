"""transformers worker wiring: a ``WorkerProcess`` whose engines are ``HfEngine``s, one model
copy each. ``python -m services.hf_worker`` runs an ``HfWorker`` under
``shared.lifecycle.run_service``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.aio.client import Client

from services.hf_worker.config import HfWorkerConfig
from services.hf_worker.engine import HfEngine, HfEngineOptions
from shared.metrics import ServiceMetrics
from shared.worker.engine import WorkerEngine
from shared.worker.metrics import WorkerMetrics
from shared.worker.process import EngineFactory, WorkerProcess
from shared.worker.runtime import WorkerRuntime

__all__ = ["HfWorker", "engine_factory", "engine_options"]


def engine_options(config: HfWorkerConfig, model_dir: Path) -> HfEngineOptions:
    """One engine's options from the worker's settings."""
    return HfEngineOptions(
        model_dir=model_dir,
        random_weights=config.random_weights,
        device=config.device,
        dtype=config.dtype,
        block_size=config.block_size,
        num_blocks=config.num_blocks,
        max_batch_tokens=config.max_batch_tokens,
        max_num_seqs=config.max_num_seqs,
        context_length=config.context_length,
        seed=config.seed,
        prefix_sharing=config.prefix_sharing,
    )


def engine_factory(config: HfWorkerConfig, model_dir: Path) -> EngineFactory:
    """``worker_id`` → a new ``HfEngine`` (each loads its own copy of the model)."""
    options = engine_options(config, model_dir)

    def make(worker_id: str) -> WorkerEngine:
        return HfEngine(options)

    return make


class HfWorker:
    """All the transformers workers of one process."""

    def __init__(
        self,
        config: HfWorkerConfig,
        nc: Client,
        *,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or WorkerMetrics(config.SERVICE)
        self._nc = nc
        self._process: WorkerProcess | None = None

    @property
    def service_metrics(self) -> ServiceMetrics:
        return self.metrics.service

    @property
    def workers(self) -> list[WorkerRuntime]:
        return self._process.workers if self._process is not None else []

    async def start(self) -> None:
        model_dir = await asyncio.to_thread(self.config.model_dir)
        self._process = WorkerProcess(
            self.config,
            self._nc,
            engine_factory(self.config, model_dir),
            model_dir=model_dir,
            metrics=self.metrics,
        )
        await self._process.start()

    async def stop(self) -> None:
        if self._process is not None:
            await self._process.stop()
