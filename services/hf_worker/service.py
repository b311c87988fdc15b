"""transformers worker wiring: a ``WorkerProcess`` whose engines are ``HfEngine``s, one model
copy each, each in an engine process of its own. ``python -m services.hf_worker`` runs an
``HfWorker`` under ``shared.lifecycle.run_service``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import structlog
from nats.aio.client import Client

from services.hf_worker.config import HfWorkerConfig
from services.hf_worker.engine import HfEngine, HfEngineOptions
from shared.worker.engine import WorkerEngine
from shared.worker.metrics import WorkerMetrics
from shared.worker.process import EngineFactory, WorkerService

log = structlog.get_logger(__name__)

__all__ = ["HfWorker", "end_worker_process", "engine_factory", "engine_options"]


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
        log_level=config.log_level,
        log_format=config.log_format,
    )


def engine_factory(config: HfWorkerConfig, model_dir: Path) -> EngineFactory:
    """``worker_id`` → a new ``HfEngine`` (each loads its own copy of the model)."""
    options = engine_options(config, model_dir)

    def make(worker_id: str) -> WorkerEngine:
        return HfEngine(options, on_core_exit=end_worker_process)

    return make


ENGINE_GONE_EXIT = 70
"""The worker's exit status when its engine process died under it (``EX_SOFTWARE``)."""


def end_worker_process(why: str) -> None:
    """The engine process is gone: end this worker process at once, as a crash would (decision
    033): routers find it lost and its requests migrate (decision 017), the launcher or the
    orchestrator starts it again. A graceful stop would wait for requests that cannot finish."""
    log.error("hf_worker_exits_with_its_engine", why=why, status=ENGINE_GONE_EXIT)
    os._exit(ENGINE_GONE_EXIT)


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
