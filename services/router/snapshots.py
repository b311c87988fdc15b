"""Index snapshots in the router object store, written by one replica at a time (a lease).

The lease is one key in a KV bucket whose max age is the lease TTL: the holder creates it and
renews it with a revision check (``update(..., last=revision)``), so two replicas can never both
believe they hold it; when the holder stops renewing, the key ages out and another replica's
``create`` succeeds. The holder writes the ``KvSync`` state (index + per-worker ``event_id`` +
the stream sequence it covers) under one object name; a starting replica loads it and consumes
the stream from the next sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import nats.errors
import structlog
from nats.js.client import JetStreamContext
from nats.js.errors import (
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
    ObjectNotFoundError,
)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from services.router.indexer import IndexSnapshot, decode_snapshot, encode_snapshot
from services.router.metrics import RouterMetrics
from services.router.sync import KvSync
from shared.registry import open_kv, open_object_store
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

SNAPSHOT_OBJECT = "kv-index"
LEASE_KEY = "snapshot-writer"


async def router_store(
    js: JetStreamContext, subjects: Subjects, *, replicas: int = 1
) -> ObjectStore:
    """Open the router object store, creating it (``replicas`` replicas) if needed."""
    return await open_object_store(js, subjects.router_store, replicas=replicas)


async def lease_bucket(
    js: JetStreamContext, subjects: Subjects, ttl_s: float, *, replicas: int = 1
) -> KeyValue:
    """Open the lease bucket, creating it with max age ``ttl_s`` if needed."""
    return await open_kv(js, subjects.router_lease_bucket, ttl_s, replicas=replicas)


async def load_snapshot(
    js: JetStreamContext, subjects: Subjects, *, replicas: int = 1
) -> IndexSnapshot | None:
    """The newest snapshot, or ``None`` when there is none (or it cannot be read)."""
    store = await router_store(js, subjects, replicas=replicas)
    try:
        result = await store.get(SNAPSHOT_OBJECT)
    except (ObjectNotFoundError, NotFoundError):
        return None
    try:
        return decode_snapshot(result.data or b"")
    except (ValueError, TypeError) as exc:  # msgspec.DecodeError is a ValueError
        log.warning("snapshot_unreadable", error=str(exc))
        return None


class Lease:
    """This replica's claim on one lease key (the snapshot writer's, unless ``key`` says)."""

    def __init__(self, kv: KeyValue, holder: str, key: str = LEASE_KEY) -> None:
        self._kv = kv
        self._holder = holder.encode()
        self._key = key
        self.revision: int | None = None

    async def refresh(self) -> bool:
        """Renew the lease if held, else try to take it; True while this replica holds it."""
        if self.revision is not None:
            try:
                self.revision = await self._kv.update(self._key, self._holder, last=self.revision)
                return True
            except KeyWrongLastSequenceError:
                log.warning("lease_lost", key=self._key)
                self.revision = None
        try:
            self.revision = await self._kv.create(self._key, self._holder)
        except KeyWrongLastSequenceError:
            return False
        log.info("lease_acquired", key=self._key)
        return True

    async def release(self) -> None:
        if self.revision is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self._key, last=self.revision)
            self.revision = None


class SnapshotWriter:
    """While holding the lease, writes the index every ``interval_s`` if it moved on."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        sync: KvSync,
        metrics: RouterMetrics,
        *,
        router_id: str,
        interval_s: float,
        lease_ttl_s: float,
        replicas: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._js = js
        self._replicas = replicas
        self._subjects = subjects
        self._sync = sync
        self._metrics = metrics
        self._router_id = router_id
        self._interval_s = interval_s
        self._lease_ttl_s = lease_ttl_s
        self._clock = clock
        self._store: ObjectStore | None = None
        self.lease: Lease | None = None
        self.written_seq = -1
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._open()
        if self._interval_s > 0:
            self._task = asyncio.create_task(self._loop(), name="router-snapshots")

    async def _open(self) -> None:
        """Open (or create) the object store and the lease bucket."""
        replicas = self._replicas
        self._store = await router_store(self._js, self._subjects, replicas=replicas)
        kv = await lease_bucket(self._js, self._subjects, self._lease_ttl_s, replicas=replicas)
        self.lease = Lease(kv, self._router_id)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.lease is not None:
            await self.lease.release()

    async def _loop(self) -> None:
        tick_s = max(0.05, min(self._interval_s, self._lease_ttl_s / 3))
        last_write = self._clock()
        while True:
            await asyncio.sleep(tick_s)
            try:
                assert self.lease is not None
                if not await self.lease.refresh():
                    continue
                if self._clock() - last_write >= self._interval_s:
                    await self.write()
                    last_write = self._clock()
            except NoStreamResponseError:
                # A nats-server that lost its store lost the lease bucket and the store too.
                log.warning("snapshot_store_missing")
                with contextlib.suppress(nats.errors.Error, OSError):
                    await self._open()
            except (nats.errors.Error, OSError) as exc:
                log.warning("snapshot_failed", error=repr(exc))

    async def write(self, *, force: bool = False) -> bool:
        """Write a snapshot now if the index moved on and no dump is in flight."""
        assert self._store is not None
        sync = self._sync
        if not sync.is_settled or (sync.stream_seq == self.written_seq and not force):
            return False
        snapshot = sync.snapshot(router_id=self._router_id, created_at=self._clock())
        data = encode_snapshot(snapshot)
        await self._store.put(SNAPSHOT_OBJECT, data)
        self.written_seq = snapshot.stream_seq
        self._metrics.snapshots.inc()
        log.info(
            "snapshot_written",
            stream_seq=snapshot.stream_seq,
            workers=len(snapshot.workers),
            bytes=len(data),
        )
        return True
