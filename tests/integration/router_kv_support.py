"""Helpers for the KV-router integration tests: routers, fake workers, hand-made KV events."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.router.config import RouterConfig
from services.router.service import Router
from shared import codec
from shared.bus import barrier, connect
from shared.kv_stream import ensure_kv_stream
from shared.messages import (
    AnyKvEvent,
    BlockStored,
    Generate,
    KvEventBatch,
    SamplingParams,
    WorkerCard,
)
from shared.registry import WorkerRegistration
from shared.subjects import Subjects
from tests.support import eventually_async

MODEL = "kv-model"


@asynccontextmanager
async def running_router(
    nats_url: str, subjects: Subjects, **overrides: Any
) -> AsyncIterator[Router]:
    settings: dict[str, Any] = {
        "router_mode": "kv",
        "snapshot_interval_s": 0.0,
        "seed": 7,
        **overrides,
    }
    nc = await connect(nats_url, name="test-router")
    router = Router(RouterConfig(nats_url=nats_url, namespace=subjects.namespace, **settings), nc)
    await router.start()
    try:
        yield router
    finally:
        await router.stop()
        await nc.drain()


class FakeWorker:
    """A registered worker card plus a subscription that collects what the router sends it; it
    answers the routers' liveness probes, as every worker does (decision 017)."""

    def __init__(self, nc: Client, subjects: Subjects, worker_id: str) -> None:
        self.worker_id = worker_id
        self._nc = nc
        self._subjects = subjects
        self.received: asyncio.Queue[Generate] = asyncio.Queue()
        self._sub: Subscription | None = None
        self._ping: Subscription | None = None
        card = WorkerCard(worker_id=worker_id, model=MODEL, block_size=16, kv_blocks=1024)
        self.registration = WorkerRegistration(nc.jetstream(), subjects, card)

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(self._subjects.generate(self.worker_id), cb=self._on)
        self._ping = await self._nc.subscribe(self._subjects.worker_ping(self.worker_id), cb=_pong)
        await self.registration.start()
        await barrier(self._nc)

    async def _on(self, msg: Msg) -> None:
        await self.received.put(codec.decode(msg.data, Generate))

    async def leave(self) -> None:
        await self.registration.stop()
        for sub in (self._sub, self._ping):
            if sub is not None:
                await sub.unsubscribe()
        self._sub = self._ping = None


async def _pong(msg: Msg) -> None:
    await msg.respond(b"")


@asynccontextmanager
async def fake_workers(
    nc: Client, subjects: Subjects, *ids: str
) -> AsyncIterator[list[FakeWorker]]:
    workers = [FakeWorker(nc, subjects, w) for w in ids]
    for worker in workers:
        await worker.start()
    try:
        yield workers
    finally:
        for worker in workers:
            await worker.leave()


class EventPublisher:
    """Publishes ``KvEventBatch``es to the stream as a worker would, numbering them per worker."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self._js = nc.jetstream()
        self._subjects = subjects
        self.next_id: dict[str, int] = {}
        self.last_seq = 0

    async def ensure_stream(self) -> None:
        await ensure_kv_stream(self._js, self._subjects)

    async def publish(
        self, worker_id: str, *events: AnyKvEvent, event_id: int | None = None
    ) -> int:
        eid = event_id if event_id is not None else self.next_id.get(worker_id, 1)
        self.next_id[worker_id] = eid + 1
        batch = KvEventBatch(worker_id=worker_id, event_id=eid, events=events, ts=time.time())
        ack = await self._js.publish(self._subjects.kv_events(worker_id), codec.encode(batch))
        self.last_seq = ack.seq
        return ack.seq

    async def store(self, worker_id: str, hashes: list[int], parent: int | None = None) -> int:
        return await self.publish(
            worker_id, BlockStored(block_hashes=tuple(hashes), parent_hash=parent)
        )


async def until(predicate: Callable[[], bool], *, what: str, timeout_s: float = 5.0) -> None:
    """Wait until ``predicate()`` holds (polling), or fail naming ``what``."""
    await eventually_async(
        predicate, timeout_s=timeout_s, message=f"timed out waiting for {what}", interval_s=0.01
    )


async def caught_up(router: Router, seq: int) -> None:
    await until(lambda: router.core.sync.stream_seq >= seq, what=f"stream seq {seq}")


def generate(tokens: tuple[int, ...], *, request_id: str | None = None, **kw: Any) -> Generate:
    rid = request_id or uuid.uuid4().hex
    return Generate(
        request_id=rid,
        model=MODEL,
        token_ids=tokens,
        sampling=SamplingParams(max_tokens=4),
        stream_to=f"unused.{rid}",
        **kw,
    )
