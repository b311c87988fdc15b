"""vLLM worker wiring: a ``WorkerProcess`` whose engines are vLLM, in this process
(``VllmEngine`` over ``loader.load_vllm``) or remote (``RemoteVllmEngine`` over a running
``vllm serve``). ``python -m services.vllm_worker`` runs a ``VllmWorker`` under
``shared.lifecycle.run_service``.
"""

from __future__ import annotations

from nats.aio.client import Client

from services.vllm_worker.config import VllmWorkerConfig
from services.vllm_worker.engine import VllmEngine, VllmHandle
from services.vllm_worker.remote import RemoteOptions, RemoteVllmEngine
from shared.metrics import ServiceMetrics
from shared.worker.engine import WorkerEngine
from shared.worker.metrics import WorkerMetrics
from shared.worker.process import EngineFactory, WorkerProcess
from shared.worker.runtime import WorkerRuntime

__all__ = ["VllmWorker", "engine_factory"]


def engine_factory(config: VllmWorkerConfig) -> EngineFactory:
    """``worker_id`` → its engine: the n-th worker id gets the n-th ``--engine-url``."""
    ids = config.worker_ids()
    urls = config.engine_urls()

    def make(worker_id: str) -> WorkerEngine:
        index = ids.index(worker_id) if worker_id in ids else 0
        if urls:
            events, replay = config.remote_endpoints(index)
            return RemoteVllmEngine(
                RemoteOptions(
                    engine_url=urls[index if index < len(urls) else 0],
                    block_size=config.block_size,
                    kv_blocks=config.kv_blocks,
                    max_num_seqs=config.max_num_seqs,
                    model=config.model_name,
                    kv_events_endpoint=events,
                    kv_replay_endpoint=replay,
                    kv_topic=config.kv_events_topic,
                    metrics_interval_s=config.metrics_interval_s,
                    startup_timeout_s=config.engine_startup_timeout_s,
                    api_key=config.engine_api_key or None,
                )
            )

        async def load() -> VllmHandle:
            from services.vllm_worker.loader import load_vllm

            return await load_vllm(config, worker_id)

        return VllmEngine(load)

    return make


class VllmWorker:
    """All the vLLM workers of one process."""

    def __init__(
        self,
        config: VllmWorkerConfig,
        nc: Client,
        *,
        make_engine: EngineFactory | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or WorkerMetrics(config.SERVICE)
        self._nc = nc
        self._make_engine = make_engine or engine_factory(config)
        self._process: WorkerProcess | None = None

    @property
    def service_metrics(self) -> ServiceMetrics:
        return self.metrics.service

    @property
    def workers(self) -> list[WorkerRuntime]:
        return self._process.workers if self._process is not None else []

    async def start(self) -> None:
        self._process = WorkerProcess(
            self.config, self._nc, self._make_engine, metrics=self.metrics
        )
        await self._process.start()

    async def stop(self) -> None:
        if self._process is not None:
            await self._process.stop()
