"""Mocker wiring: a ``WorkerProcess`` whose engines are simulated (``SimulatedEngine``), all
sharing the model's files and tokenized corpus. ``python -m services.mocker`` runs a ``Mocker``
under ``shared.lifecycle.run_service``.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from services.mocker.config import MockerConfig
from services.mocker.model import ModelInfo, load_model_info
from services.mocker.simulated import SimulatedEngine
from shared.metrics import ServiceMetrics
from shared.worker.metrics import WorkerMetrics
from shared.worker.process import WorkerProcess
from shared.worker.runtime import WorkerRuntime

__all__ = ["Mocker", "ModelInfo", "WorkerRuntime", "load_model_info"]


class Mocker:
    """All the simulated workers of one process (``WorkerProcess`` with simulated engines)."""

    def __init__(
        self,
        config: MockerConfig,
        nc: Client,
        model: ModelInfo | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or WorkerMetrics("mocker")
        self._nc = nc
        self._model = model
        self._process: WorkerProcess | None = None

    @property
    def service_metrics(self) -> ServiceMetrics:
        return self.metrics.service

    @property
    def workers(self) -> list[WorkerRuntime]:
        return self._process.workers if self._process is not None else []

    async def start(self) -> None:
        """Read the model (corpus, tokenizer) once, then start the process's workers."""
        model = self._model
        if model is None:
            model = self._model = await asyncio.to_thread(load_model_info, self.config)
        self._process = WorkerProcess(
            self.config,
            self._nc,
            lambda _worker_id: SimulatedEngine(self.config, model),
            model_dir=model.model_dir,
            metrics=self.metrics,
        )
        await self._process.start()

    async def stop(self) -> None:
        if self._process is not None:
            await self._process.stop()
