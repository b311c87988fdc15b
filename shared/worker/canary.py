"""The engine watch of one worker: sends the canary into the engine and runs the watchdog loop
around ``health.EngineHealth``; its verdicts go to the runtime (decision 029).

The canary is an ``EngineInput`` of the runtime's own (id ``canary-<worker>-<random>-<n>``: no
client can name it): it never
passes the ``generate`` boundary, so nothing is streamed, no lifecycle phase is published and no
request is counted; the runtime hands its emissions here (``ended``) instead of to an outbox.
The runtime counts the engine's progress in ``progress`` (one per emission or step it is handed).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable

import structlog

from shared.hashing import salted_seed
from shared.worker.health import Action, CanaryPayload, EngineHealth, HealthSettings
from shared.worker.metrics import WorkerMetrics
from shared.worker.records import Emission, EngineError, EngineInput

log = structlog.get_logger(__name__)

CANARY_SEED = salted_seed()


class EngineWatch:
    """One worker's canary and watchdog (see the module docstring)."""

    def __init__(
        self,
        worker_id: str,
        settings: HealthSettings,
        payload: CanaryPayload,
        *,
        busy: Callable[[], bool],
        submit: Callable[[EngineInput], None],
        on_unhealthy: Callable[[str], Awaitable[None]],
        on_recovered: Callable[[], Awaitable[None]],
        metrics: WorkerMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker_id = worker_id
        self.progress = 0
        """Outputs and steps the engine handed the runtime so far (the runtime counts them)."""
        self.canary_id = ""
        """The canary in the engine now ("" when none)."""
        self._prefix = f"canary-{worker_id}-{secrets.token_hex(4)}-"
        self._settings = settings
        self._payload = payload
        self._busy = busy
        self._submit = submit
        self._on_unhealthy = on_unhealthy
        self._on_recovered = on_recovered
        self._metrics = metrics
        self._clock = clock
        self._health = EngineHealth(settings, clock())
        self._sent = 0
        self._sent_at = 0.0
        self._pending: Action | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        metrics.engine_healthy.labels(worker_id).set(1)

    @property
    def healthy(self) -> bool:
        return self._health.healthy

    def owns(self, request_id: str) -> bool:
        """Whether ``request_id`` is one of this watch's canaries (the current one or an
        earlier one whose late emissions still arrive)."""
        return request_id.startswith(self._prefix)

    def start(self) -> None:
        """Start watching (nothing to do when every check is off)."""
        if self._settings.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"engine-watch-{self.worker_id}")

    async def stop(self) -> None:
        """Stop watching; a canary still in the engine is cancelled with it, unjudged."""
        self.canary_id = ""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def ended(self, emission: Emission) -> None:
        """A canary emission: its last one (``done``) ends it, finished or cancelled."""
        if emission.done and emission.request_id == self.canary_id:
            self._end(ok=emission.finish_reason != "cancelled", detail=emission.finish_reason)

    def failed(self, request_id: str, detail: str) -> None:
        """The engine ended the canary with an error."""
        if request_id == self.canary_id:
            self._end(ok=False, detail=detail)

    def _end(self, *, ok: bool, detail: str | None) -> None:
        self.canary_id = ""
        took_ms = round((self._clock() - self._sent_at) * 1000, 1)
        if ok:
            log.debug("health_check_passed", worker_id=self.worker_id, took_ms=took_ms)
        else:
            log.warning(
                "health_check_failed", worker_id=self.worker_id, took_ms=took_ms, detail=detail
            )
        action = self._health.canary_ended(self._clock(), ok=ok)
        if action is not None:
            self._pending = action
            self._wake.set()

    async def _loop(self) -> None:
        tick_s = self._settings.tick_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), tick_s)
            self._wake.clear()
            action, self._pending = self._pending, None
            if action is None:
                action = self._health.observe(self._clock(), self.progress, busy=self._busy())
            if action is None:
                continue
            try:
                await self._act(action)
            except Exception:  # a task's boundary: log once, keep watching
                log.exception("engine_watch_failed", worker_id=self.worker_id, action=action)

    async def _act(self, action: Action) -> None:
        if action == "send_canary":
            self._send()
        elif action == "unhealthy":
            await self._unhealthy()
        else:
            self._metrics.engine_healthy.labels(self.worker_id).set(1)
            log.warning("engine_recovered", worker_id=self.worker_id)
            await self._on_recovered()

    def _send(self) -> None:
        self._sent += 1
        canary_id = f"{self._prefix}{self._sent}"
        request = EngineInput(
            request_id=canary_id,
            token_ids=self._payload.token_ids,
            sampling=self._payload.sampling,
            hash_seed=CANARY_SEED,
        )
        self._sent_at = self._clock()
        self.canary_id = canary_id
        log.debug("health_check_sent", worker_id=self.worker_id, request_id=canary_id)
        try:
            self._submit(request)
        except EngineError as exc:  # the engine refuses the payload: that is a failed canary
            self._end(ok=False, detail=f"refused: {exc}")

    async def _unhealthy(self) -> None:
        health, now = self._health, self._clock()
        reason = health.reason or "engine_stalled"
        self._metrics.engine_healthy.labels(self.worker_id).set(0)
        self._metrics.engine_unhealthy.labels(self.worker_id, reason).inc()
        log.error(
            "engine_unhealthy",
            worker_id=self.worker_id,
            reason=reason,
            since_progress_s=round(health.since_progress(now), 3),
            busy=self._busy(),
            canary_timeout_s=self._settings.timeout_s,
            engine_stall_s=self._settings.stall_s,
        )
        await self._on_unhealthy(reason)
