"""One simulated GPU worker: ``generate``/``cancel`` subscriptions → engine loop → token batches.

The loop steps the engine, sleeps the simulated time (or bursts at speedup 0, see decision
005), hands KV events to the publisher without waiting, and publishes lifecycle and load.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import bound_contextvars

from services.mocker.config import MockerConfig
from services.mocker.engine import Emission, Engine, EngineConfig, EngineError
from services.mocker.metrics import MockerMetrics
from services.mocker.model import ModelInfo
from services.mocker.outbox import Outbox
from services.mocker.publisher import WorkerPublisher
from shared import codec
from shared.bus import barrier
from shared.errors import (
    ContextLengthExceeded,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    ServiceError,
    ShuttingDown,
)
from shared.hashing import salted_seed
from shared.messages import Cancel, Generate, TokenBatch, WorkerCard
from shared.recent import RecentIds
from shared.registry import WorkerRegistration
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

FLUSH_EVERY_STEPS = 8
"""At speedup 0, publish buffered tokens (and yield) after this many back-to-back steps ..."""
FLUSH_INTERVAL_S = 0.001
"""... or after this much wall time, whichever comes first."""
MAX_TIMING_DEBT_S = 0.05
"""When publishing falls behind the simulated clock, forgive at most this much lag."""


def engine_config(config: MockerConfig, model: ModelInfo) -> EngineConfig:
    """The engine settings a worker runs with."""
    return EngineConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        block_size=config.block_size,
        num_gpu_blocks=config.num_gpu_blocks_override,
        enable_prefix_caching=config.enable_prefix_caching,
        first_token_decodes=config.dynamo_step_timing,
        seed=config.seed,
        speedup_ratio=config.speedup_ratio,
        eos_token_ids=model.eos_token_ids,
    )


class MockWorker:
    """One simulated GPU worker: its subscriptions, its engine loop and its registry card."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        config: MockerConfig,
        model: ModelInfo,
        worker_id: str,
        metrics: MockerMetrics,
    ) -> None:
        self.worker_id = worker_id
        self._nc = nc
        self._subjects = subjects
        self._config = config
        self._model = model
        self._metrics = metrics
        self.engine = Engine(engine_config(config, model), model.corpus)
        self.publisher = WorkerPublisher(
            nc,
            subjects,
            worker_id,
            self.engine,
            metrics,
            kv_stream_limits=(config.kv_stream_max_age_s, config.kv_stream_max_bytes),
        )
        self._outbox = Outbox(worker_id)
        self._early_cancels = RecentIds(ttl_s=60.0)
        """Cancels for requests not (yet) here: a Generate that arrives after its cancel."""
        card = WorkerCard(
            worker_id=worker_id,
            model=config.model_name,
            kind="mocker",
            block_size=config.block_size,
            kv_blocks=config.num_gpu_blocks_override,
            max_num_seqs=config.max_num_seqs,
            context_length=model.context_length,
        )
        self._registration = WorkerRegistration(
            nc.jetstream(), subjects, card, ttl_s=config.worker_ttl_s
        )
        self._subs: list[Subscription] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._accepting = False
        self._loop_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Reset the cache, subscribe, start the loop, then register (the card means "ready")."""
        self.engine.reset_cache()  # event 1 = AllBlocksCleared: routers drop a past life's blocks
        await self.publisher.start()
        self._accepting = True
        self._subs.append(
            await self._nc.subscribe(self._subjects.generate(self.worker_id), cb=self.on_generate)
        )
        self._subs.append(await self._nc.subscribe(self._subjects.cancel, cb=self.on_cancel))
        await barrier(self._nc)  # subscribed on the server before the card says "ready"
        self._loop_task = asyncio.create_task(self._loop(), name=f"engine-{self.worker_id}")
        await self._registration.start()
        log.info("worker_started", worker_id=self.worker_id, model=self._config.model_name)

    async def stop(self, grace_s: float) -> None:
        """Leave the registry, stop taking work, finish in-flight work (bounded), then stop."""
        self._accepting = False
        await self._registration.stop()
        if self._subs:
            with contextlib.suppress(Exception):
                await self._subs[0].unsubscribe()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=grace_s)
        except TimeoutError:
            cancelled = self.engine.cancel_all()
            log.warning("requests_cancelled_on_shutdown", count=len(cancelled))
            for emission in cancelled:
                self._outbox.add(emission)
            await self._phases(cancelled)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        await self._flush(self._outbox.dirty())
        for sub in self._subs[1:]:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self.publisher.collect_kv_events()
        await self.publisher.stop()
        log.info("worker_stopped", worker_id=self.worker_id)

    # --- handlers --------------------------------------------------------------------------------

    async def on_generate(self, msg: Msg) -> None:
        try:
            gen = codec.decode(msg.data, Generate)
        except codec.DecodeError as exc:
            log.warning("bad_message", subject=msg.subject, error=str(exc))
            return
        with (
            bound_contextvars(request_id=gen.request_id, worker_id=self.worker_id),
            self._metrics.service.handling("generate"),
        ):
            if self._early_cancels.pop(gen.request_id, time.monotonic()):
                await self._drop_cancelled(gen)
                return
            try:
                self._admit(gen)
                return
            except ServiceError as exc:
                log.warning("request_rejected", code=exc.code, error=exc.message)
                failed = exc
            except Exception:
                log.exception("request_failed")
                failed = InternalError("the worker failed to accept the request")
            self._metrics.service.error(failed.code)
            await self._nc.publish(gen.stream_to, codec.encode(failed.to_message(gen.request_id)))
            await self.publisher.phase(gen.request_id, "finished")  # routers free its slot

    async def _drop_cancelled(self, gen: Generate) -> None:
        """The client gave up before this request reached us: end it without generating."""
        log.info("request_cancelled", worker_id=self.worker_id, reason="cancelled_before_arrival")
        ended = TokenBatch(
            request_id=gen.request_id,
            token_ids=(),
            finish_reason="cancelled",
            prompt_tokens=len(gen.token_ids),
            worker_id=self.worker_id,
        )
        await self._nc.publish(gen.stream_to, codec.encode(ended))
        await self.publisher.phase(gen.request_id, "finished")  # routers free its slot

    def _admit(self, gen: Generate) -> None:
        if not self._accepting:
            raise ShuttingDown(f"worker {self.worker_id} is shutting down")
        if gen.model != self._config.model_name:
            raise ModelNotFound(gen.model)
        if gen.request_id in self.engine or gen.request_id in self._outbox:
            log.warning("duplicate_request_ignored")
            return
        prompt_tokens = len(gen.token_ids)
        requested = prompt_tokens + gen.sampling.max_tokens
        if requested > self._model.context_length:
            raise ContextLengthExceeded(
                limit=self._model.context_length, requested=requested, prompt_tokens=prompt_tokens
            )
        routing = gen.routing
        lora_name = routing.lora_name if routing else None
        seed = salted_seed(lora_name=lora_name, cache_salt=routing.cache_salt if routing else None)
        try:
            self.engine.add(
                gen.request_id, gen.token_ids, gen.sampling, hash_seed=seed, lora_name=lora_name
            )
        except EngineError as exc:
            raise InvalidRequest(str(exc)) from exc
        self._outbox.open(gen.request_id, gen.stream_to, prompt_tokens=prompt_tokens)
        log.debug("request_received", prompt_tokens=prompt_tokens)
        self._idle.clear()
        self._wake.set()

    async def on_cancel(self, msg: Msg) -> None:
        try:
            cancel = codec.decode(msg.data, Cancel)
        except codec.DecodeError as exc:
            log.warning("bad_message", subject=msg.subject, error=str(exc))
            return
        emission = self.engine.cancel(cancel.request_id)
        if emission is None:
            # Not ours (cancel is a broadcast), finished, or still on its way to us.
            self._early_cancels.add(cancel.request_id, time.monotonic())
            return
        self._outbox.add(emission)
        log.info(
            "request_cancelled",
            request_id=cancel.request_id,
            worker_id=self.worker_id,
            reason=cancel.reason,
        )
        await self._flush([cancel.request_id])
        await self._phases([emission])
        if not self.engine.has_work:
            self._idle.set()
            await self.publisher.report_load(is_idle=True)

    # --- engine loop -----------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._run_until_idle()
            except Exception:
                log.exception("engine_loop_failed")
                await self._fail_all()
            if not self.engine.has_work:
                self._idle.set()
                await self.publisher.report_load(is_idle=True)

    async def _run_until_idle(self) -> None:
        """Step while there is work; sleep the simulated time, or burst at speedup 0."""
        is_sleeping = self._config.speedup_ratio > 0
        deadline = time.perf_counter()
        burst_start, burst_steps = deadline, 0
        emit_before_decode = self._config.dynamo_step_timing
        while self.engine.has_work:
            out = self.engine.step()
            self.publisher.collect_kv_events()
            if is_sleeping:
                now = time.perf_counter()
                start = max(deadline, now - MAX_TIMING_DEBT_S)
                deadline = start + out.duration_s
                # Dynamo's mocker sleeps a step's prefill, emits, then sleeps its decode.
                emit_at = start + out.prefill_s if emit_before_decode else deadline
                await asyncio.sleep(max(0.0, emit_at - now))
            urgent = [e.request_id for e in out.emissions if self._outbox.add(e)]
            if is_sleeping:
                await self._flush(self._outbox.dirty())
                await self._phases(out.emissions)
                await self.publisher.report_load()
                if emit_before_decode:
                    await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
                continue
            await self._flush(urgent)
            await self._phases(out.emissions)
            burst_steps += 1
            if burst_steps >= FLUSH_EVERY_STEPS or time.perf_counter() - burst_start >= (
                FLUSH_INTERVAL_S
            ):
                await self._flush(self._outbox.dirty())
                await self.publisher.report_load()
                await asyncio.sleep(0)  # let generate/cancel handlers run
                burst_start, burst_steps = time.perf_counter(), 0
        await self._flush(self._outbox.dirty())

    async def _phases(self, emissions: list[Emission]) -> None:
        """``prefill_done`` with a request's first token, ``finished`` with its last batch."""
        for e in emissions:
            if e.index == 0 and e.token_ids:
                await self.publisher.phase(e.request_id, "prefill_done")
            if e.finish_reason is not None:
                await self.publisher.phase(e.request_id, "finished")

    async def _flush(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            taken = self._outbox.take(request_id)
            if taken is None:
                continue
            stream_to, batch = taken
            await self._nc.publish(stream_to, codec.encode(batch))
            if batch.finish_reason is not None:
                log.info(
                    "request_finished",
                    request_id=request_id,
                    worker_id=self.worker_id,
                    finish_reason=batch.finish_reason,
                    completion_tokens=batch.index + len(batch.token_ids),
                )

    async def _fail_all(self) -> None:
        failed = InternalError("the simulated engine failed")
        emissions = self.engine.cancel_all()
        for emission in emissions:
            taken = self._outbox.take(emission.request_id)
            self._outbox.close(emission.request_id)
            if taken is not None:
                message = failed.to_message(emission.request_id)
                await self._nc.publish(taken[0], codec.encode(message))
        await self._phases(emissions)
