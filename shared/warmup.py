"""Load a model's tokenizer (and template) as soon as a worker for it registers.

Without this the first request of each model pays the load (0.3-0.6 s idle, seconds under
load) inside its time to first token, and can even hit the gateway's timeout. A service that
(re)starts while workers are registered waits for ``ready()`` before it takes requests, so a
restart under load is a short gap the gateway retries across, not seconds of queued requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog
from nats.js.client import JetStreamContext

from shared.registry import DEFAULT_WORKER_TTL_S, WorkerDirectory
from shared.subjects import Subjects

log = structlog.get_logger(__name__)


class ModelWarmer:
    """Watches the worker registry and calls ``load(model)`` once per newly served model."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        load: Callable[[str], Awaitable[object]],
        *,
        ttl_s: float = DEFAULT_WORKER_TTL_S,
    ) -> None:
        self._load = load
        self._directory = WorkerDirectory(js, subjects, ttl_s=ttl_s, on_change=self._changed)
        self._warmed: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self._directory.start()
        self._changed()

    async def ready(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until the models served right now are loaded."""
        pending = list(self._tasks)
        if pending:
            _, late = await asyncio.wait(pending, timeout=timeout_s)
            if late:
                log.warning("model_warm_up_slow", waited_s=timeout_s, pending=len(late))

    async def stop(self) -> None:
        await self._directory.stop()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _changed(self) -> None:
        for model in self._directory.models() - self._warmed:
            self._warmed.add(model)
            task = asyncio.create_task(self._warm(model), name=f"warm-{model}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _warm(self, model: str) -> None:
        try:
            await self._load(model)
            log.info("model_warmed", model=model)
        except Exception as exc:  # noqa: BLE001 - a failed warm-up is retried by the first request
            self._warmed.discard(model)
            log.warning("model_warm_up_failed", model=model, error=str(exc))
