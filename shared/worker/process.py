"""A worker process: one NATS connection, the model's files and card, and ``num_workers``
workers, each a ``WorkerRuntime`` around an engine from the process's factory.

The model's card and files are published once per process and the KV-events stream is ensured
before any worker publishes to it; then every worker starts (its engine loads, then its card
says "ready"). An engine package (``services.mocker``, ``services.vllm_worker``,
``services.hf_worker``) builds one of these with its own config and engine factory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from nats.aio.client import Client

from shared.kv_stream import ensure_kv_stream
from shared.messages import ModelCard
from shared.metrics import ServiceMetrics
from shared.model_dir import context_length, eos_token_ids
from shared.registry import publish_model
from shared.subjects import Subjects
from shared.vision_model import vision_spec
from shared.worker.config import WorkerConfig
from shared.worker.engine import WorkerEngine
from shared.worker.metrics import WorkerMetrics
from shared.worker.runtime import WorkerRuntime

EngineFactory = Callable[[str], WorkerEngine]
"""``worker_id`` → a new, not yet started engine for that worker."""


def model_created(model_dir: Path) -> int:
    """The newest mtime of the directory's files, in whole seconds: every worker serving this
    directory publishes the same card."""
    times = [p.stat().st_mtime for p in model_dir.iterdir() if p.is_file()]
    return int(max(times, default=model_dir.stat().st_mtime))


def model_card(
    config: WorkerConfig, model_dir: Path, *, context: int = 0, block_size: int = 0
) -> ModelCard:
    """The card of the served model, from its directory and the worker's settings."""
    tool_parser, reasoning_parser = config.parsers()
    return ModelCard(
        model=config.model_name,
        context_length=context or config.context_length or context_length(model_dir),
        eos_token_ids=eos_token_ids(model_dir),
        created=model_created(model_dir),
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        kv_block_size=block_size,
        vision=vision_spec(model_dir),
    )


class WorkerProcess:
    """All the workers of one process, sharing a connection and the model's files."""

    def __init__(
        self,
        config: WorkerConfig,
        nc: Client,
        make_engine: EngineFactory,
        *,
        model_dir: Path | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or WorkerMetrics(config.SERVICE)
        self._nc = nc
        self._subjects = Subjects(config.namespace)
        self._make_engine = make_engine
        self._model_dir = model_dir
        self.workers: list[WorkerRuntime] = []

    async def start(self) -> None:
        """Ensure the KV stream, start every worker's engine, publish the model's files and
        card, then start and register every worker."""
        model_dir = self._model_dir
        if model_dir is None:
            model_dir = self._model_dir = await asyncio.to_thread(self.config.resolved_model_dir)
        js = self._nc.jetstream()
        replicas = self.config.js_replicas
        workers = [
            WorkerRuntime(
                self._nc,
                self._subjects,
                self.config,
                self._make_engine(worker_id),
                worker_id,
                self.metrics,
            )
            for worker_id in self.config.worker_ids()
        ]
        await ensure_kv_stream(
            js,
            self._subjects,
            max_age_s=self.config.kv_stream_max_age_s,
            max_bytes=self.config.kv_stream_max_bytes,
            replicas=replicas,
        )
        for worker in workers:
            await worker.prepare()
        # The model's card first (with the engine's context length), then the workers' cards.
        first = workers[0]
        card = model_card(
            self.config, model_dir, context=first.context_length, block_size=first.block_size
        )
        await publish_model(js, self._subjects, card, model_dir, replicas=replicas)
        for worker in workers:
            await worker.start()
            self.workers.append(worker)

    async def stop(self) -> None:
        """Stop every worker at once (each leaves the registry first)."""
        grace_s = self.config.shutdown_grace_s
        await asyncio.gather(*(w.stop(grace_s) for w in self.workers))


class WorkerService:
    """A worker service's ``Service`` for ``run_service``: its ``WorkerProcess`` once started.

    An engine package subclasses it and says, in ``engines``, how its engines are made (and
    from which model directory), loading whatever they share first.
    """

    def __init__(
        self, config: WorkerConfig, nc: Client, *, metrics: WorkerMetrics | None = None
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

    async def engines(self) -> tuple[EngineFactory, Path | None]:
        """``(engine factory, model directory)``; None = ``config.resolved_model_dir()``."""
        raise NotImplementedError

    async def start(self) -> None:
        make_engine, model_dir = await self.engines()
        self._process = WorkerProcess(
            self.config, self._nc, make_engine, model_dir=model_dir, metrics=self.metrics
        )
        await self._process.start()

    async def stop(self) -> None:
        if self._process is not None:
            await self._process.stop()
