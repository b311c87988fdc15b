"""The mocker as a ``WorkerEngine``: the pure simulated ``Engine`` stepped on a simulated GPU
clock (``pacing.Pacer``, decision 005), its emissions handed to the worker runtime's sink."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from services.mocker.config import MockerConfig
from services.mocker.engine import Engine
from services.mocker.model import ModelInfo
from services.mocker.pacing import Pacer
from services.mocker.records import EngineConfig
from shared.messages import AnyKvEvent, BlockStored
from shared.worker.engine import EmissionSink
from shared.worker.records import Emission, EngineFacts, EngineInput, EngineLoad, EngineStats


def engine_config(config: MockerConfig, model: ModelInfo) -> EngineConfig:
    """The simulated engine's settings."""
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


class SimulatedEngine:
    """``WorkerEngine`` over the simulated ``Engine``: one per mocker worker."""

    def __init__(self, config: MockerConfig, model: ModelInfo) -> None:
        self._config = config
        self._model = model
        self.engine = Engine(engine_config(config, model), model.corpus, encode=model.encode)
        self.stats: EngineStats = self.engine.stats

    async def start(self) -> EngineFacts:
        return EngineFacts(
            kind="mocker",
            block_size=self._config.block_size,
            kv_blocks=self._config.num_gpu_blocks_override,
            max_num_seqs=self._config.max_num_seqs,
            context_length=self._model.context_length,
        )

    async def stop(self) -> None:
        return None

    @property
    def has_work(self) -> bool:
        return self.engine.has_work

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.engine

    def add(self, request: EngineInput) -> None:
        self.engine.add(
            request.request_id,
            request.token_ids,
            request.sampling,
            hash_seed=request.hash_seed,
            lora_name=request.lora_name,
            resumed_tokens=request.resumed_tokens,
        )

    def cancel(self, request_id: str) -> Emission | None:
        return self.engine.cancel(request_id)

    def cancel_all(self) -> list[Emission]:
        return self.engine.cancel_all()

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
        while engine.has_work:
            out = engine.step()
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
