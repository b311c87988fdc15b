"""vLLM worker wiring: a ``WorkerProcess`` whose engines are vLLM, in this process
(``VllmEngine`` over ``loader.load_vllm``) or remote (``RemoteVllmEngine`` over a running
``vllm serve``). ``python -m services.vllm_worker`` runs a ``VllmWorker`` under
``shared.lifecycle.run_service``.
"""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from services.vllm_worker.config import VllmWorkerConfig
from services.vllm_worker.engine import VllmEngine, VllmHandle
from services.vllm_worker.remote import RemoteOptions, RemoteVllmEngine
from shared.worker.engine import WorkerEngine
from shared.worker.metrics import WorkerMetrics
from shared.worker.process import EngineFactory, WorkerService

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
                    dp_size=config.data_parallel_size,
                )
            )

        async def load() -> VllmHandle:
            from services.vllm_worker.loader import load_vllm

            return await load_vllm(config, worker_id)

        return VllmEngine(load)

    return make


class VllmWorker(WorkerService):
    """All the vLLM workers of one process."""

    def __init__(
        self,
        config: VllmWorkerConfig,
        nc: Client,
        *,
        make_engine: EngineFactory | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        super().__init__(config, nc, metrics=metrics)
        self._make_engine = make_engine or engine_factory(config)

    async def engines(self) -> tuple[EngineFactory, Path | None]:
        return self._make_engine, None
