"""Mocker wiring: a ``WorkerProcess`` whose engines are simulated (``SimulatedEngine``, or a
``DataParallelEngine`` of several with ``--data-parallel-size``), all sharing the model's files
and tokenized corpus. ``python -m services.mocker`` runs a ``Mocker``
under ``shared.lifecycle.run_service``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.aio.client import Client

from services.mocker.config import MockerConfig
from services.mocker.data_parallel import make_engine
from services.mocker.model import ModelInfo, load_model_info
from shared.worker.metrics import WorkerMetrics
from shared.worker.process import EngineFactory, WorkerService
from shared.worker.runtime import WorkerRuntime

__all__ = ["Mocker", "ModelInfo", "WorkerRuntime", "load_model_info"]


class Mocker(WorkerService):
    """All the simulated workers of one process, sharing the model's corpus and tokenizer."""

    def __init__(
        self,
        config: MockerConfig,
        nc: Client,
        model: ModelInfo | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        super().__init__(config, nc, metrics=metrics)
        self.config: MockerConfig = config
        self._model = model

    async def engines(self) -> tuple[EngineFactory, Path]:
        """Read the model (corpus, tokenizer) once; every engine shares it."""
        model = self._model
        if model is None:
            model = self._model = await asyncio.to_thread(load_model_info, self.config)
        config = self.config
        return (lambda _worker_id: make_engine(config, model)), model.model_dir
