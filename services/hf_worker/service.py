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
from shared.worker.engine import WorkerEngine
from shared.worker.metrics import WorkerMetrics
from shared.worker.process import EngineFactory, WorkerService

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


class HfWorker(WorkerService):
    """All the transformers workers of one process (each engine loads its own model copy)."""

    def __init__(
        self, config: HfWorkerConfig, nc: Client, *, metrics: WorkerMetrics | None = None
    ) -> None:
        super().__init__(config, nc, metrics=metrics)
        self.config: HfWorkerConfig = config

    async def engines(self) -> tuple[EngineFactory, Path]:
        model_dir = await asyncio.to_thread(self.config.model_dir)
        return engine_factory(self.config, model_dir), model_dir
