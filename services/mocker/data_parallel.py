"""A mocker worker with data-parallel ranks (``--data-parallel-size`` N > 1): N simulated engines
behind one worker id, as vLLM's data-parallel engine cores are (one GPU each).

Each rank has its own scheduler, KV cache (its events carry its ``dp_rank``) and step clock; a
request runs on ``EngineInput.dp_rank``. ``run`` steps every rank that has work concurrently, each
on its own pacing, and starts a rank's loop again when a request reaches it meanwhile. Load,
counters and dumps are the ranks' together (the card's ``kv_blocks`` is one rank's). With one
rank, ``make_engine`` returns a plain ``SimulatedEngine``: nothing here is on that path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from services.mocker.config import MockerConfig
from services.mocker.model import ModelInfo
from services.mocker.simulated import SimulatedEngine
from shared.messages import AnyKvEvent, BlockStored
from shared.worker.engine import EmissionSink, WorkerEngine
from shared.worker.records import (
    Emission,
    EngineError,
    EngineFacts,
    EngineInput,
    EngineLoad,
    EngineStats,
)

__all__ = ["DataParallelEngine", "make_engine"]


def make_engine(config: MockerConfig, model: ModelInfo) -> WorkerEngine:
    """One mocker worker's engine: ``data_parallel_size`` ranks sharing their counters."""
    if config.data_parallel_size == 1:
        return SimulatedEngine(config, model)
    stats = EngineStats()
    ranks = [
        SimulatedEngine(config, model, dp_rank=rank, stats=stats)
        for rank in range(config.data_parallel_size)
    ]
    return DataParallelEngine(ranks, stats)


class DataParallelEngine:
    """``WorkerEngine`` over several ``SimulatedEngine`` ranks (see the module docstring)."""

    def __init__(self, ranks: list[SimulatedEngine], stats: EngineStats) -> None:
        if not ranks:
            raise ValueError("a data-parallel engine needs at least one rank")
        self.ranks = ranks
        self.stats = stats
        self._changed = asyncio.Event()
        """A request reached some rank: ``run`` starts the loops of ranks with work."""

    async def start(self) -> EngineFacts:
        facts = [await rank.start() for rank in self.ranks]
        return facts[0]

    async def stop(self) -> None:
        for rank in self.ranks:
            await rank.stop()

    async def load_lora(self, name: str, path: str) -> None:
        """Every rank holds the worker's adapters (each loads them into its own slots)."""
        for rank in self.ranks:
            await rank.load_lora(name, path)

    async def unload_lora(self, name: str) -> None:
        for rank in self.ranks:
            await rank.unload_lora(name)

    @property
    def has_work(self) -> bool:
        return any(rank.has_work for rank in self.ranks)

    @property
    def num_waiting(self) -> int:
        return sum(rank.num_waiting for rank in self.ranks)

    def __contains__(self, request_id: str) -> bool:
        return any(request_id in rank for rank in self.ranks)

    def add(self, request: EngineInput) -> None:
        if not 0 <= request.dp_rank < len(self.ranks):
            raise EngineError(f"dp_rank {request.dp_rank} is not below {len(self.ranks)}")
        self.ranks[request.dp_rank].add(request)
        self._changed.set()

    def cancel(self, request_id: str) -> Emission | None:
        for rank in self.ranks:
            emission = rank.cancel(request_id)
            if emission is not None:
                return emission
        return None

    def cancel_all(self) -> list[Emission]:
        return [e for rank in self.ranks for e in rank.cancel_all()]

    def release_kv(self, request_id: str) -> bool:
        return any(rank.release_kv(request_id) for rank in self.ranks)

    def reset_cache(self) -> None:
        for rank in self.ranks:
            rank.reset_cache()

    def take_kv_events(self) -> list[AnyKvEvent]:
        return [e for rank in self.ranks for e in rank.take_kv_events()]

    def on_kv_events(self, wake: Callable[[], None]) -> None:
        """The ranks' caches change only inside ``run``, where the sink collects."""

    def kv_dump(self, *, with_tokens: bool) -> list[BlockStored]:
        return [e for rank in self.ranks for e in rank.kv_dump(with_tokens=with_tokens)]

    def load(self) -> EngineLoad:
        loads = [rank.load() for rank in self.ranks]
        return EngineLoad(
            active=sum(x.active for x in loads),
            waiting=sum(x.waiting for x in loads),
            kv_used_blocks=sum(x.kv_used_blocks for x in loads),
            kv_total_blocks=sum(x.kv_total_blocks for x in loads),
            prefill_tokens=sum(x.prefill_tokens for x in loads),
        )

    async def run(self, sink: EmissionSink) -> None:
        """Run each rank with work in a task of its own until no rank has work."""
        running: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                self._changed.clear()
                for number, rank in enumerate(self.ranks):
                    if rank.has_work and number not in running:
                        running[number] = asyncio.create_task(
                            rank.run(sink), name=f"engine-rank-{number}"
                        )
                if not running:
                    return
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait(
                        [*running.values(), changed], return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    changed.cancel()
                for number, task in list(running.items()):
                    if task.done():
                        del running[number]
                        task.result()  # a rank's failure fails the run (the runtime's boundary)
        finally:
            for task in running.values():
                task.cancel()
            for task in running.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
