"""The session bucket (``Subjects.sessions_bucket``): bindings shared by every router replica.

Each replica watches the bucket into a ``SessionTable`` (every key's latest value, then every
change), so a turn's routing reads memory, never the bucket. Writes are compare-and-set: a
first turn's binding is created with ``create`` (two replicas racing on a session's first turns
agree: the loser adopts the winner's binding), and a move or refresh names the revision it
replaces (a concurrent move wins, and is adopted). The bucket's max age is the session TTL: a
refresh rewrites the value, restarting it; a restarted router's watch loads what is still live.

nats-py 2.16 offers per-message TTLs only on ``create`` (``update`` and ``put`` take none), so
a refresh could not carry one: the TTL is the bucket's (the first router that creates the
bucket sets it; a router configured otherwise logs ``session_bucket_ttl_differs`` and expires
its in-memory bindings by its own TTL). Max-age expiry sends watchers nothing, hence the
table's own expiry by each value's timestamp.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from services.router.sessions import Binding, SessionTable, StoredBinding
from shared import codec
from shared.registry.jetstream import open_kv
from shared.registry.watch import BucketWatch, is_kv_removal
from shared.subjects import Subjects
from shared.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

WATCH_CHECK_S = 2.0
"""How often the store asks the server whether its watch still exists."""
WATCH_CHECK_TIMEOUT_S = 1.0
READY_TIMEOUT_S = 10.0


class SessionStore:
    """The session bucket, its watch and its compare-and-set writes."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        *,
        ttl_s: float,
        router_id: str,
        replicas: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._js = js
        self._bucket = subjects.sessions_bucket
        self._router_id = router_id
        self._replicas = replicas
        self._clock = clock
        self.table = SessionTable(ttl_s)
        self._kv: KeyValue | None = None
        self._watch = BucketWatch(js, self._bucket, self._on_entry)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open (or create) the bucket and load every live binding before returning."""
        self._kv = await open_kv(self._js, self._bucket, self.table.ttl_s, replicas=self._replicas)
        status = await self._kv.status()
        if status.ttl and abs(status.ttl - self.table.ttl_s) > 0.5:
            log.warning(
                "session_bucket_ttl_differs", bucket_ttl_s=status.ttl, ttl_s=self.table.ttl_s
            )
        await self._watch.watch()
        await asyncio.wait_for(self._watch.ready.wait(), READY_TIMEOUT_S)
        self._task = asyncio.create_task(self._guard(), name="session-watch")
        log.info("sessions_loaded", bindings=len(self.table))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
        await self._watch.stop()

    def binding(self, key: str) -> Binding | None:
        """The live binding of ``key`` as this replica knows it (memory only)."""
        return self.table.get(key, self._clock())

    # --- writes (compare-and-set) ----------------------------------------------------------------
    async def create(self, key: str, worker_id: str, dp_rank: int) -> tuple[Binding, bool]:
        """Bind ``key`` unless another replica did first; the binding now, and whether ours."""
        kv = self._bucket_kv()
        value = self._value(worker_id, dp_rank)
        try:
            revision = await kv.create(key, value)
        except KeyWrongLastSequenceError:
            return await self._adopt(key), False
        return self._keep(key, worker_id, dp_rank, revision), True

    async def replace(
        self, key: str, old: Binding, worker_id: str, dp_rank: int
    ) -> tuple[Binding, bool]:
        """Move (or refresh, same target) the binding ``old``; if another replica changed it
        meanwhile, theirs stands: the binding now, and whether ours."""
        kv = self._bucket_kv()
        try:
            revision = await kv.update(key, self._value(worker_id, dp_rank), last=old.revision)
        except KeyWrongLastSequenceError:
            return await self._adopt(key), False
        return self._keep(key, worker_id, dp_rank, revision), True

    def _bucket_kv(self) -> KeyValue:
        if self._kv is None:
            raise RuntimeError("the session store is not started")
        return self._kv

    def _value(self, worker_id: str, dp_rank: int) -> bytes:
        return codec.encode(
            StoredBinding(worker_id=worker_id, dp_rank=dp_rank, router_id=self._router_id)
        )

    def _keep(self, key: str, worker_id: str, dp_rank: int, revision: int) -> Binding:
        binding = Binding(worker_id, dp_rank, revision, self._clock())
        self.table.put(key, binding)
        return binding

    async def _adopt(self, key: str) -> Binding:
        """The binding another replica wrote (read now: its watch delivery may lag)."""
        kv = self._bucket_kv()
        try:
            entry = await kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            raise KeyWrongLastSequenceError(description=f"session {key} vanished") from None
        stored = codec.decode(entry.value or b"", StoredBinding)
        binding = Binding(stored.worker_id, stored.dp_rank, entry.revision or 0, self._clock())
        self.table.put(key, binding)
        return binding

    # --- the watch -------------------------------------------------------------------------------
    async def _on_entry(self, msg: Msg) -> None:
        """Every key's latest value, then every change, into the table."""
        key = self._watch.key(msg)
        meta = msg.metadata
        revision = meta.sequence.stream
        if is_kv_removal(msg):
            self.table.remove(key, revision)
        else:
            try:
                stored = codec.decode(msg.data, StoredBinding)
            except msgspec.DecodeError as exc:
                log.warning("bad_session_binding", key=key, error=str(exc))
            else:
                written = meta.timestamp.timestamp() if meta.timestamp else self._clock()
                self.table.put(key, Binding(stored.worker_id, stored.dp_rank, revision, written))
        self._watch.seen(msg)

    async def _guard(self) -> None:
        """Forever: when the server lost the watch (it restarted), watch again."""
        while True:
            await asyncio.sleep(WATCH_CHECK_S)
            self.table.expire(self._clock())
            alive = await self._watch.alive(WATCH_CHECK_TIMEOUT_S)
            if alive is not False:
                continue
            try:
                self._kv = await open_kv(
                    self._js, self._bucket, self.table.ttl_s, replicas=self._replicas, retry_s=0
                )
                await self._watch.watch()
                log.info("sessions_rewatched", bindings=len(self.table))
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("sessions_rewatch_failed", error=repr(exc))
