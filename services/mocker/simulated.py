"""The mocker as a ``WorkerEngine``: the pure simulated ``Engine`` stepped on a simulated GPU
clock (``pacing.Pacer``, decision 005), its emissions handed to the worker runtime's sink.

Disaggregated serving: while a decode phase pulls its blocks the loop keeps stepping the other
requests, and with nothing else to step it sleeps until the next pull lands (or a request
arrives or is cancelled); a landed pull is told to the sink (``kv_pulled``). A prefill's pinned
blocks are freed by ``release_kv``, or by a timer when their timeout passes on an idle engine.
One ``SimulatedEngine`` is one data-parallel rank (``data_parallel.DataParallelEngine`` runs
several).

LoRA adapters (``lora.AdapterSlots``): a request for an adapter that is not loaded waits outside
the pure engine until its load (``--lora-load-time-s``) lands; the loop sleeps until then when
nothing else runs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from services.mocker.config import MockerConfig
from services.mocker.engine import Engine
from services.mocker.hang import Hang
from services.mocker.lora import AdapterSlots
from services.mocker.model import ModelInfo
from services.mocker.pacing import Pacer
from services.mocker.records import EngineConfig
from shared.errors import WorkerBusy
from shared.images import mm_spans
from shared.messages import AnyKvEvent, BlockStored
from shared.worker.engine import EmissionSink
from shared.worker.records import (
    Emission,
    EngineError,
    EngineFacts,
    EngineInput,
    EngineLoad,
    EngineStats,
)


def engine_config(config: MockerConfig, model: ModelInfo, dp_rank: int = 0) -> EngineConfig:
    """The simulated engine's settings (of data-parallel rank ``dp_rank``)."""
    block_bytes = config.kv_block_bytes or model.kv_bytes_per_token * config.block_size
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
        dp_rank=dp_rank,
        kv_block_bytes=block_bytes,
        kv_transfer_bandwidth_gbps=config.kv_transfer_bandwidth_gbps,
        kv_transfer_latency_ms=config.kv_transfer_latency_ms,
        kv_pin_timeout_s=config.kv_pin_timeout_s,
    )


class SimulatedEngine:
    """``WorkerEngine`` over the simulated ``Engine``: one per mocker worker (or rank)."""

    def __init__(
        self,
        config: MockerConfig,
        model: ModelInfo,
        *,
        dp_rank: int = 0,
        stats: EngineStats | None = None,
    ) -> None:
        self._config = config
        self._model = model
        self.engine = Engine(
            engine_config(config, model, dp_rank), model.corpus, encode=model.encode, stats=stats
        )
        self.stats: EngineStats = self.engine.stats
        self._changed = asyncio.Event()
        """A request came or went: a loop waiting for a pull looks again."""
        self._pin_timer: asyncio.TimerHandle | None = None
        self._hang = Hang(config.hang_after_tokens, config.hang_for_s)
        """Test/debug only: stop stepping after so many tokens (``services.mocker.hang``)."""
        speedup = config.speedup_ratio
        self.adapters: AdapterSlots[EngineInput] = AdapterSlots(
            config.max_loras, config.lora_load_time_s / speedup if speedup > 0 else 0.0
        )
        self._lora_failed: list[EngineInput] = []
        """Requests that waited for an adapter dropped meanwhile (``run`` fails them)."""

    async def start(self) -> EngineFacts:
        return EngineFacts(
            kind="mocker",
            block_size=self._config.block_size,
            kv_blocks=self._config.num_gpu_blocks_override,
            max_num_seqs=self._config.max_num_seqs,
            context_length=self._model.context_length,
            kv_pin_timeout_s=self._config.kv_pin_timeout_s,
        )

    async def stop(self) -> None:
        if self._pin_timer is not None:
            self._pin_timer.cancel()
            self._pin_timer = None

    @property
    def has_work(self) -> bool:
        return self.engine.has_work or bool(self.adapters.num_waiting or self._lora_failed)

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting + self.adapters.num_waiting

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.engine or request_id in self.adapters

    # --- LoRA adapters (shared.worker.engine.AdapterEngine) -------------------------------------
    async def load_lora(self, name: str, path: str) -> None:
        self.adapters.hold(name, path, self.engine.now())
        self._changed.set()

    async def unload_lora(self, name: str) -> None:
        self._lora_failed.extend(self.adapters.drop(name))
        self._changed.set()

    def add(self, request: EngineInput) -> None:
        lora = request.lora_name
        if lora is not None and lora not in self.adapters.held:
            raise EngineError(f"LoRA adapter {lora!r} is not held by this engine")
        if self.adapters.admit(request.request_id, lora, request):
            self._add_now(request)
        else:
            self._changed.set()

    def _add_now(self, request: EngineInput) -> None:
        self.engine.add(
            request.request_id,
            request.token_ids,
            request.sampling,
            hash_seed=request.hash_seed,
            lora_name=request.lora_name,
            resumed_tokens=request.resumed_tokens,
            phase=request.phase,
            kv_transfer=request.kv_transfer_params,
            images=mm_spans(request.images),
        )
        self._changed.set()

    def cancel(self, request_id: str) -> Emission | None:
        waiting = self.adapters.cancel(request_id)
        if waiting is not None:
            return _cancelled(waiting)
        emission = self.engine.cancel(request_id)
        if emission is not None:
            self.adapters.done(request_id)
            self._changed.set()
        return emission

    def release_kv(self, request_id: str) -> bool:
        return self.engine.release_pin(request_id)

    def cancel_all(self) -> list[Emission]:
        emissions = [_cancelled(r) for r in (*self._lora_failed, *self.adapters.take_all())]
        self._lora_failed.clear()
        for emission in self.engine.cancel_all():
            self.adapters.done(emission.request_id)
            emissions.append(emission)
        return emissions

    def reset_cache(self) -> None:
        self.engine.reset_cache()

    def take_kv_events(self) -> list[AnyKvEvent]:
        return self.engine.take_kv_events()

    def on_kv_events(self, wake: Callable[[], None]) -> None:
        """The simulated cache changes only inside ``run``, where the sink collects."""

    def kv_dump(self, *, with_tokens: bool) -> list[BlockStored]:
        return self.engine.cache.dump(with_tokens=with_tokens)

    def load(self) -> EngineLoad:
        return self.engine.load()

    async def run(self, sink: EmissionSink) -> None:
        """Step while there is work; sleep and publish when the pacer says."""
        engine = self.engine
        clock = time.perf_counter
        pacer = Pacer(
            speedup_ratio=self._config.speedup_ratio,
            emit_after_prefill=self._config.dynamo_step_timing,
            now=clock(),
        )
        while self.has_work:
            if self._hang.is_due:
                await self._hang.wait()
            if self._lora_failed:
                await self._fail_dropped(sink)
            if self.adapters.num_waiting:
                for request in self.adapters.advance(engine.now()):
                    self._add_now(request)
                if not engine.has_work:
                    await self._await_change(self.adapters.next_ready_at())
                    continue
            if engine.pulls.pending and not engine.is_stepping:
                if await self._await_pull():
                    continue  # something changed: look again
                pacer = Pacer(  # waiting for a pull is not timing debt
                    speedup_ratio=self._config.speedup_ratio,
                    emit_after_prefill=self._config.dynamo_step_timing,
                    now=clock(),
                )
            out = engine.step()
            if not self._hang.done:
                self._hang.count(sum(len(e.token_ids) for e in out.emissions))
            for e in out.emissions:
                if e.done:
                    self.adapters.done(e.request_id)
            if out.pulled:
                for request_id, blocks in out.pulled:
                    await sink.kv_pulled(request_id, blocks)
            sink.collect()
            if pacer.is_sleeping:
                now = clock()
                times = pacer.step(now, out.duration_s, out.prefill_s)
                await asyncio.sleep(max(0.0, times.emit_at - now))
                for e in out.emissions:
                    sink.add(e)
                await sink.flush()
                await sink.phases(out.emissions)
                await sink.progress()
                if times.end_at is not None:
                    await asyncio.sleep(max(0.0, times.end_at - clock()))
                continue
            urgent = [e.request_id for e in out.emissions if sink.add(e)]
            await sink.flush(urgent)
            await sink.phases(out.emissions)
            if pacer.flush_due(clock()):
                await sink.flush()
                await sink.progress()
                await asyncio.sleep(0)  # let generate/cancel handlers run
                pacer.flushed(clock())
        await sink.flush()
        self._arm_pin_timer()

    async def _await_change(self, until: float | None) -> None:
        """Sleep until the engine clock reaches ``until`` (None: no timer), or a request comes,
        goes, or an adapter is loaded or dropped."""
        self._changed.clear()
        delay = None if until is None else max(0.0, until - self.engine.now())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), delay)

    async def _fail_dropped(self, sink: EmissionSink) -> None:
        """Requests whose adapter was unloaded while they waited: a retryable 503 that the
        formatter routes to a worker still holding it."""
        failed, self._lora_failed = self._lora_failed, []
        for request in failed:
            message = f"LoRA adapter {request.lora_name!r} was unloaded from this worker"
            await sink.fail(request.request_id, WorkerBusy(message))

    async def _await_pull(self) -> bool:
        """Only pulls in flight: sleep until the next lands; True if a request came or went
        first (or the pull is gone), False when the pull is due (a step lands it)."""
        next_at = self.engine.next_pull_at()
        if next_at is None:
            return True
        delay = next_at - self.engine.now()
        if delay <= 0:
            return False
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), delay)
        except TimeoutError:
            return False
        return True

    def _arm_pin_timer(self) -> None:
        """Free pins as they time out while the engine is idle (a step frees them otherwise)."""
        expiry = self.engine.pins.next_expiry
        if self._pin_timer is not None or expiry is None:
            return
        delay = max(0.0, expiry - self.engine.now()) + 0.001
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to time
            self._pin_timer = asyncio.get_running_loop().call_later(delay, self._on_pin_timer)

    def _on_pin_timer(self) -> None:
        self._pin_timer = None
        self.engine.expire_pins()
        self._arm_pin_timer()


def _cancelled(request: EngineInput) -> Emission:
    """The last emission of a request cancelled before it entered the engine."""
    return Emission(
        request_id=request.request_id,
        token_ids=(),
        index=0,
        finish_reason="cancelled",
        prompt_tokens=len(request.token_ids),
        done=True,
    )
