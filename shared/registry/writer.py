"""The writer side (workers): a heartbeated card (``WorkerRegistration``) and ``publish_model``
(``publish_model_card`` for a model with no files, such as a tensor model).

Workers of one model start together: a put over an object another worker is putting purges
the chunks a reader may be fetching, so each file content is uploaded by one worker (the one
that creates its lease in the uploads bucket) while the others wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from pathlib import Path

import msgspec
import nats.errors
import structlog
from nats.js.client import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError, NoStreamResponseError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from shared import codec
from shared.messages import ModelCard, WorkerCard
from shared.registry.jetstream import content_digest, object_digest, open_kv, read_object
from shared.registry.layout import (
    CARD,
    DEFAULT_WORKER_TTL_S,
    MODEL_FILES,
    models_store,
    object_name,
    workers_bucket,
)
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

UPLOAD_LEASE_S = 30.0
"""How long another worker waits for the upload it leases; after that it uploads itself."""
UPLOAD_POLL_S = 0.05
HEARTBEAT_RETRY_S = 0.25
"""After a failed heartbeat, try again this soon, so the card is fresh right after an outage."""


async def publish_model(
    js: JetStreamContext,
    subjects: Subjects,
    card: ModelCard,
    model_dir: Path,
    *,
    lease_s: float = UPLOAD_LEASE_S,
    replicas: int = 1,
) -> None:
    """Upload the model's files (only those whose digest changed), then its card."""
    store = await models_store(js, subjects, replicas=replicas)
    leases = await open_kv(js, subjects.model_uploads_bucket, lease_s, replicas=replicas)
    names: list[str] = []
    for file in MODEL_FILES:
        path = model_dir / file
        if not path.is_file():
            continue
        names.append(file)
        data = path.read_bytes()
        await _put_if_changed(store, leases, object_name(card.model, file), data, lease_s)
    stored = msgspec.structs.replace(card, files=tuple(names))
    await _put_card(store, leases, stored, lease_s)


async def publish_model_card(
    js: JetStreamContext,
    subjects: Subjects,
    card: ModelCard,
    *,
    lease_s: float = UPLOAD_LEASE_S,
    replicas: int = 1,
) -> None:
    """Upload the card of a model that has no files (a tensor model), if it changed."""
    store = await models_store(js, subjects, replicas=replicas)
    leases = await open_kv(js, subjects.model_uploads_bucket, lease_s, replicas=replicas)
    await _put_card(store, leases, msgspec.structs.replace(card, files=()), lease_s)


async def _put_card(store: ObjectStore, leases: KeyValue, card: ModelCard, lease_s: float) -> None:
    """Upload ``card`` unless the stored one differs only in ``created``.

    Each worker stamps its start time on the card: had every worker uploaded its own, each
    upload would purge the chunks of the card a preprocessor was reading (it then waited for
    them until its read timed out, and the requests behind it with it).
    """
    name = object_name(card.model, CARD)
    current = await read_object(store, name)
    if current:
        try:
            stored = codec.decode(current, ModelCard)
        except msgspec.DecodeError:  # written by another version: replace it
            stored = None
        if stored is not None and msgspec.structs.replace(card, created=stored.created) == stored:
            return
    await _put_if_changed(store, leases, name, codec.encode(card), lease_s)


async def _put_if_changed(
    store: ObjectStore, leases: KeyValue, name: str, data: bytes, lease_s: float
) -> None:
    digest = content_digest(data)
    if await object_digest(store, name) == digest:
        return
    try:
        await leases.create(upload_lease_key(name, digest), b"")
    except KeyWrongLastSequenceError:  # another worker is uploading this very content
        deadline = time.monotonic() + lease_s
        while time.monotonic() < deadline:
            await asyncio.sleep(UPLOAD_POLL_S)
            if await object_digest(store, name) == digest:
                return
        log.warning("model_upload_lease_expired", name=name)
    await store.put(name, data)
    log.info("model_file_uploaded", name=name, size=len(data))


def upload_lease_key(name: str, digest: str) -> str:
    """The lease key of uploading ``digest`` content as object ``name``."""
    return hashlib.sha256(f"{name}\n{digest}".encode()).hexdigest()


class WorkerRegistration:
    """Keeps one worker card alive in the bucket by heartbeat; deletes it on ``stop``."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        card: WorkerCard,
        *,
        ttl_s: float = DEFAULT_WORKER_TTL_S,
        replicas: int = 1,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._card = card
        self._ttl_s = ttl_s
        self._replicas = replicas
        self._kv: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._kv = await workers_bucket(
            self._js, self._subjects, self._ttl_s, replicas=self._replicas
        )
        await self._beat()
        self._task = asyncio.create_task(self._loop(), name="worker-heartbeat")

    @property
    def card(self) -> WorkerCard:
        return self._card

    async def update(self, card: WorkerCard) -> None:
        """Replace the card (same worker; its start time kept) and put it at once if registered,
        so readers see the change now rather than at the next heartbeat."""
        self._card = msgspec.structs.replace(card, started_at=self._card.started_at)
        if self._kv is not None and self._task is not None:
            await self._beat()

    async def _beat(self) -> None:
        assert self._kv is not None
        now = time.time()
        card = msgspec.structs.replace(
            self._card, heartbeat_at=now, started_at=self._card.started_at or now
        )
        self._card = card
        await self._kv.put(card.worker_id, codec.encode(card))

    async def _loop(self) -> None:
        """Beat every TTL/3; after a failure, every ``HEARTBEAT_RETRY_S`` until one lands."""
        interval_s = self._ttl_s / 3
        delay_s = interval_s
        while True:
            await asyncio.sleep(delay_s)
            try:
                # A put made while NATS is down waits in nats-py's buffer and lands as soon as
                # the connection is back; the bound only decides when to try another.
                await asyncio.wait_for(self._beat(), interval_s)
            except NoStreamResponseError:  # a server that lost its store: create the bucket
                log.warning("heartbeat_bucket_missing")
                delay_s = min(HEARTBEAT_RETRY_S, interval_s)
                # Bounded, not retried: the card expires after TTL, so the next beat must come.
                # (A stream that lost its leader answers "no responders" too, and opening it
                # then can wait seconds for the new one.)
                reopen = workers_bucket(
                    self._js, self._subjects, self._ttl_s, replicas=self._replicas, retry_s=0
                )
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    self._kv = await asyncio.wait_for(reopen, interval_s)
            except Exception as exc:  # noqa: BLE001 - keep beating through NATS outages
                if delay_s == interval_s:
                    log.warning("heartbeat_failed", error=repr(exc))
                delay_s = min(HEARTBEAT_RETRY_S, interval_s)
            else:
                if delay_s != interval_s:
                    log.info("heartbeat_resumed")
                delay_s = interval_s

    async def stop(self) -> None:
        """Stop the heartbeat and delete the card (the worker leaves the registry at once)."""
        task, self._task = self._task, None  # an update after this puts nothing back
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self._card.worker_id)
