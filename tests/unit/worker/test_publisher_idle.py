"""The KV event sender lingers to gather a few steps into one JetStream batch, except when the
worker goes idle: then nothing more is coming, and the batch goes at once (a one-at-a-time
client's next request does not meet it on its way). Fakes stand in for nats-py and the engine:
only the sender's timing logic is under test."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.messages import BlockStored
from shared.subjects import Subjects
from shared.worker import publisher as publisher_module
from shared.worker.metrics import WorkerMetrics
from shared.worker.publisher import WorkerPublisher
from shared.worker.records import EngineLoad, EngineStats


class _JetStream:
    def __init__(self) -> None:
        self.stored: list[bytes] = []
        self.has_stored = asyncio.Event()

    async def publish(self, subject: str, data: bytes, **_: Any) -> None:
        self.stored.append(data)
        self.has_stored.set()


class _Nats:
    """What ``WorkerPublisher`` calls on a nats-py client."""

    def __init__(self) -> None:
        self.js = _JetStream()

    def jetstream(self) -> _JetStream:
        return self.js

    async def subscribe(self, *_: Any, **__: Any) -> None:
        return None

    async def publish(self, *_: Any, **__: Any) -> None:
        return None


class _Engine:
    def __init__(self) -> None:
        self.events = [BlockStored(block_hashes=(1, 2), parent_hash=None)]
        self.stats = EngineStats()

    def take_kv_events(self) -> list[BlockStored]:
        events, self.events = self.events, []
        return events

    def load(self) -> EngineLoad:
        return EngineLoad(
            active=0, waiting=0, kv_used_blocks=0, kv_total_blocks=8, prefill_tokens=0
        )


@pytest.fixture
def long_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "KV_BATCH_LINGER_S", 30.0)


async def _settle() -> None:
    """Run every task that can run until it waits (no time passes: a linger is not over)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def _publisher() -> tuple[WorkerPublisher, _Nats]:
    nc = _Nats()
    pub = WorkerPublisher(nc, Subjects("t"), "w1", _Engine(), WorkerMetrics())  # type: ignore[arg-type]
    await pub.start()  # collects the engine's first events
    return pub, nc


@pytest.mark.usefixtures("long_linger")
async def test_a_busy_worker_lingers_before_storing() -> None:
    pub, nc = await _publisher()
    await _settle()  # the sender waits out its (30 s) linger
    assert nc.js.stored == []
    await pub.stop(timeout_s=1.0)  # stopping sends what is left
    assert len(nc.js.stored) == 1


@pytest.mark.usefixtures("long_linger")
async def test_an_idle_worker_stores_at_once() -> None:
    pub, nc = await _publisher()
    await _settle()  # the sender waits out its (30 s) linger
    pub.idle()
    await asyncio.wait_for(nc.js.has_stored.wait(), 5)
    assert len(nc.js.stored) == 1
    await pub.stop(timeout_s=1.0)


async def test_idle_with_nothing_gathered_sends_nothing() -> None:
    pub, nc = await _publisher()
    await asyncio.wait_for(nc.js.has_stored.wait(), 5)  # the start-up batch, after the linger
    await _settle()
    sent = len(nc.js.stored)
    pub.idle()
    await _settle()
    assert len(nc.js.stored) == sent
    await pub.stop(timeout_s=1.0)
