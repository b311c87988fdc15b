"""The model registry on JetStream: worker cards in a KV bucket, model files in an object store.

Workers register (``WorkerRegistration``) and publish their model's files (``publish_model``);
every other service reads through ``WorkerDirectory`` (a watch on the bucket, expired by TTL
locally because max-age expiry sends watchers nothing) and ``ModelFiles`` (cached downloads).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import structlog
from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
    ObjectNotFoundError,
)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from shared import codec
from shared.messages import ModelCard, WorkerCard
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

DEFAULT_WORKER_TTL_S = 10.0
FETCH_TIMEOUT_S = 10.0
FETCH_ATTEMPTS = 3
MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")
CARD = "card"


def object_name(model: str, file: str) -> str:
    """Object-store name of one file of one model."""
    return f"{model}/{file}"


async def open_kv(js: JetStreamContext, bucket: str, ttl_s: float) -> KeyValue:
    """Open a KV bucket, creating it (history 1, max age ``ttl_s``) if it does not exist.

    Services start together, so two may find the bucket missing and both create it; the
    loser's create fails when its settings differ ("stream name already in use"), and then it
    opens the winner's bucket.
    """
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError:
        config = KeyValueConfig(bucket=bucket, history=1, ttl=ttl_s, storage=StorageType.FILE)
        try:
            return await js.create_key_value(config=config)
        except BadRequestError:
            return await js.key_value(bucket)


async def open_object_store(js: JetStreamContext, name: str) -> ObjectStore:
    """Open an object store, creating it if it does not exist (race-safe as ``open_kv``)."""
    try:
        return await js.object_store(name)
    except (BucketNotFoundError, NotFoundError):
        config = ObjectStoreConfig(bucket=name, storage=StorageType.FILE)
        try:
            # nats-py overwrites config.bucket with the ``bucket`` argument, so pass both.
            return await js.create_object_store(name, config=config)
        except BadRequestError:
            return await js.object_store(name)


async def workers_bucket(js: JetStreamContext, subjects: Subjects, ttl_s: float) -> KeyValue:
    """Open the workers KV bucket, creating it (max age = ``ttl_s``) if it does not exist."""
    return await open_kv(js, subjects.workers_bucket, ttl_s)


async def models_store(js: JetStreamContext, subjects: Subjects) -> ObjectStore:
    """Open the models object store, creating it if it does not exist."""
    return await open_object_store(js, subjects.models_store)


# --- pure core -----------------------------------------------------------------------------------


def is_live(card: WorkerCard, now: float, ttl_s: float) -> bool:
    """A card is live while its last heartbeat is younger than the TTL."""
    return now - card.heartbeat_at < ttl_s


@dataclass
class LiveWorkers:
    """Worker cards seen so far, by id. Pure: the clock is passed in."""

    ttl_s: float
    cards: dict[str, WorkerCard] = field(default_factory=dict)

    def put(self, card: WorkerCard) -> None:
        self.cards[card.worker_id] = card

    def remove(self, worker_id: str) -> WorkerCard | None:
        return self.cards.pop(worker_id, None)

    def expire(self, now: float) -> list[WorkerCard]:
        """Drop and return the cards whose heartbeat is older than the TTL."""
        dead = [c for c in self.cards.values() if not is_live(c, now, self.ttl_s)]
        for card in dead:
            del self.cards[card.worker_id]
        return dead

    def for_model(self, model: str, now: float) -> list[WorkerCard]:
        """Live workers serving ``model``, ordered by worker id (stable for round-robin)."""
        return sorted(
            (c for c in self.cards.values() if c.model == model and is_live(c, now, self.ttl_s)),
            key=lambda c: c.worker_id,
        )

    def models(self, now: float) -> set[str]:
        """Models with at least one live worker."""
        return {c.model for c in self.cards.values() if is_live(c, now, self.ttl_s)}


# --- reader side ---------------------------------------------------------------------------------


class WorkerDirectory:
    """Keeps a ``LiveWorkers`` view in sync with the workers bucket through a KV watch."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        *,
        ttl_s: float = DEFAULT_WORKER_TTL_S,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._clock = clock
        self._on_change = on_change
        self.view = LiveWorkers(ttl_s=ttl_s)
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        """Open the bucket and start watching; returns once the initial values are loaded."""
        kv = await workers_bucket(self._js, self._subjects, self.view.ttl_s)
        watcher = await kv.watchall()
        self._task = asyncio.create_task(self._watch(watcher), name="worker-directory")
        await asyncio.wait_for(self._ready.wait(), timeout=10)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is None:  # end of the initial values
                self._ready.set()
                continue
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                if self.view.remove(entry.key) is not None:
                    log.info("worker_deregistered", worker_id=entry.key)
            else:
                card = codec.decode(entry.value, WorkerCard)
                if card.worker_id not in self.view.cards:
                    log.info("worker_registered", worker_id=card.worker_id, model=card.model)
                self.view.put(card)
            self._ready.set()
            if self._on_change is not None:
                self._on_change()

    def live(self, model: str) -> list[WorkerCard]:
        """Live workers for ``model`` right now."""
        return self.view.for_model(model, self._clock())

    def models(self) -> set[str]:
        """Models with at least one live worker right now."""
        return self.view.models(self._clock())

    def card(self, worker_id: str) -> WorkerCard | None:
        """The card of one live worker, if it is live."""
        card = self.view.cards.get(worker_id)
        if card is None or not is_live(card, self._clock(), self.view.ttl_s):
            return None
        return card


class ModelFiles:
    """Reads model cards and files from the object store; caches them per model."""

    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._store: ObjectStore | None = None
        self._cache: dict[tuple[str, str], bytes] = {}

    async def _open(self) -> ObjectStore:
        if self._store is None:
            self._store = await models_store(self._js, self._subjects)
        return self._store

    async def get(self, model: str, file: str, *, cached: bool = True) -> bytes | None:
        """One file of a model (``None`` if the model or the file was never published)."""
        key = (model, file)
        if cached and key in self._cache:
            return self._cache[key]
        store = await self._open()
        name = object_name(model, file)
        for attempt in range(1, FETCH_ATTEMPTS + 1):
            try:
                result = await asyncio.wait_for(store.get(name), FETCH_TIMEOUT_S)
                break
            except (ObjectNotFoundError, NotFoundError):
                return None
            except TimeoutError:
                # Another worker re-uploaded the object while we read it (its old chunks are
                # purged, and nats-py waits for them forever): read the new version.
                log.warning("model_file_read_timed_out", name=name, attempt=attempt)
        else:
            raise TimeoutError(f"could not read {name} from the model registry")
        data = result.data or b""
        self._cache[key] = data
        return data

    async def card(self, model: str, *, cached: bool = True) -> ModelCard | None:
        """The model's card, or ``None`` if no worker ever published this model."""
        data = await self.get(model, CARD, cached=cached)
        return codec.decode(data, ModelCard) if data else None

    def forget(self, model: str) -> None:
        """Drop a model's cached files (after a worker republished them)."""
        for key in [k for k in self._cache if k[0] == model]:
            del self._cache[key]


# --- writer side (workers) -----------------------------------------------------------------------


UPLOAD_LEASE_S = 30.0
"""How long another worker waits for the upload it leases; after that it uploads itself."""
UPLOAD_POLL_S = 0.05


async def publish_model(
    js: JetStreamContext,
    subjects: Subjects,
    card: ModelCard,
    model_dir: Path,
    *,
    lease_s: float = UPLOAD_LEASE_S,
) -> None:
    """Upload the model's files (only those whose digest changed), then its card.

    Workers of one model start together: a put over an object another worker is putting purges
    the chunks a reader may be fetching, so each file content is uploaded by one worker (the
    one that creates its lease in ``model_uploads_bucket``) while the others wait for it.
    """
    store = await models_store(js, subjects)
    leases = await open_kv(js, subjects.model_uploads_bucket, lease_s)
    names: list[str] = []
    for file in MODEL_FILES:
        path = model_dir / file
        if not path.is_file():
            continue
        names.append(file)
        data = path.read_bytes()
        await _put_if_changed(store, leases, object_name(card.model, file), data, lease_s)
    stored = ModelCard(
        model=card.model,
        context_length=card.context_length,
        eos_token_ids=card.eos_token_ids,
        files=tuple(names),
        created=card.created,
    )
    await _put_if_changed(
        store, leases, object_name(card.model, CARD), codec.encode(stored), lease_s
    )


async def _put_if_changed(
    store: ObjectStore, leases: KeyValue, name: str, data: bytes, lease_s: float
) -> None:
    digest = content_digest(data)
    if await _stored_digest(store, name) == digest:
        return
    try:
        await leases.create(upload_lease_key(name, digest), b"")
    except KeyWrongLastSequenceError:  # another worker is uploading this very content
        deadline = time.monotonic() + lease_s
        while time.monotonic() < deadline:
            await asyncio.sleep(UPLOAD_POLL_S)
            if await _stored_digest(store, name) == digest:
                return
        log.warning("model_upload_lease_expired", name=name)
    await store.put(name, data)
    log.info("model_file_uploaded", name=name, size=len(data))


def upload_lease_key(name: str, digest: str) -> str:
    """The lease key of uploading ``digest`` content as object ``name``."""
    return hashlib.sha256(f"{name}\n{digest}".encode()).hexdigest()


def content_digest(data: bytes) -> str:
    """An object's digest as the object store reports it (``SHA-256=`` + base64url)."""
    return "SHA-256=" + _b64url(hashlib.sha256(data).digest())


async def _stored_digest(store: ObjectStore, name: str) -> str | None:
    try:
        info = await store.get_info(name)
    except (ObjectNotFoundError, NotFoundError):
        return None
    digest: str | None = info.digest
    return digest


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


class WorkerRegistration:
    """Keeps one worker card alive in the bucket by heartbeat; deletes it on ``stop``."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        card: WorkerCard,
        *,
        ttl_s: float = DEFAULT_WORKER_TTL_S,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._card = card
        self._ttl_s = ttl_s
        self._kv: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._kv = await workers_bucket(self._js, self._subjects, self._ttl_s)
        await self._beat()
        self._task = asyncio.create_task(self._loop(), name="worker-heartbeat")

    async def _beat(self) -> None:
        assert self._kv is not None
        now = time.time()
        card = msgspec.structs.replace(
            self._card, heartbeat_at=now, started_at=self._card.started_at or now
        )
        self._card = card
        await self._kv.put(card.worker_id, codec.encode(card))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            try:
                await self._beat()
            except Exception as exc:  # noqa: BLE001 - keep beating through NATS hiccups
                log.warning("heartbeat_failed", error=str(exc))

    async def stop(self) -> None:
        """Stop the heartbeat and delete the card (the worker leaves the registry at once)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self._card.worker_id)


def live_model_names(cards: Iterable[WorkerCard]) -> list[str]:
    """Sorted distinct model names of ``cards``."""
    return sorted({c.model for c in cards})
