"""JetStream helpers: race-safe bucket and object-store creation at a replica count, a race-free
listing of a bucket's entries, bounded object reads, digests."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import structlog
from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType
from nats.js.client import KV_PRE_TEMPLATE, KV_STREAM_TEMPLATE, JetStreamContext
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    NotFoundError,
    ObjectNotFoundError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue
from nats.js.object_store import OBJ_STREAM_TEMPLATE, ObjectStore

log = structlog.get_logger(__name__)

FETCH_BASE_S = 2.0
"""A read's timeout before its size is counted: a small object (a card) comes in one chunk."""
FETCH_MIN_BYTES_PER_S = 2 * 1024 * 1024
"""The slowest read rate still believed (a 11 MB tokenizer gets 2 + 5.5 s)."""
FETCH_ATTEMPTS = 4

REPLICATE_TIMEOUT_S = 10.0
REPLICATE_POLL_S = 0.1

OPEN_BUDGET_S = 30.0
"""How long opening a bucket or store keeps retrying a JetStream API that does not answer."""
OPEN_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)

TRANSIENT = (nats.errors.TimeoutError, nats.errors.NoRespondersError, ServiceUnavailableError)
"""A JetStream API request that may well succeed when asked again: unanswered (a cluster
electing its meta leader, a node going away under the request) or "temporarily unavailable"."""

T = TypeVar("T")


async def retry_transient(
    op: Callable[[], Awaitable[T]], what: str, *, budget_s: float = OPEN_BUDGET_S
) -> T:
    """``op()``, asked again (backing off) while it fails with a :data:`TRANSIENT` error, for
    at most ``budget_s``; then the last error. Only for idempotent requests (opening, looking up).

    In a three-node cluster a service's first ``STREAM.INFO`` went unanswered for nats-py's
    5 s while the others' were answered, and the formatter died at start-up with "nats:
    timeout" (the launcher restarted it, and requests waited seconds for a formatter)."""
    deadline = time.monotonic() + budget_s
    attempt = 0
    while True:
        try:
            return await op()
        except TRANSIENT as exc:
            delay = OPEN_BACKOFF_S[min(attempt, len(OPEN_BACKOFF_S) - 1)]
            attempt += 1
            if time.monotonic() + delay >= deadline:
                raise
            log.warning("jetstream_retry", what=what, attempt=attempt, error=repr(exc))
            await asyncio.sleep(delay)


async def open_kv(
    js: JetStreamContext,
    bucket: str,
    ttl_s: float,
    *,
    replicas: int = 1,
    retry_s: float = OPEN_BUDGET_S,
) -> KeyValue:
    """Open a KV bucket, creating it (history 1, max age ``ttl_s``) if it does not exist.

    Services start together, so two may find the bucket missing and both create it; the
    loser's create fails when its settings differ ("stream name already in use"), and then it
    opens the winner's bucket. Either way the bucket ends with at least ``replicas`` replicas
    (see :func:`ensure_replicas`). A request the cluster leaves unanswered is asked again
    for up to ``retry_s`` (:func:`retry_transient`): at start-up. A loop that opens the bucket
    again later (a heartbeat) passes 0 and tries again on its own schedule.
    """
    return await retry_transient(
        lambda: _open_kv(js, bucket, ttl_s, replicas), bucket, budget_s=retry_s
    )


async def _open_kv(js: JetStreamContext, bucket: str, ttl_s: float, replicas: int) -> KeyValue:
    try:
        kv = await js.key_value(bucket)
    except BucketNotFoundError:
        config = KeyValueConfig(
            bucket=bucket, history=1, ttl=ttl_s, storage=StorageType.FILE, replicas=replicas
        )
        try:
            kv = await js.create_key_value(config=config)
        except BadRequestError as exc:
            kv = await _open_after_failed_create(js.key_value, bucket, exc)
        else:
            await _wait_created(js, KV_STREAM_TEMPLATE.format(bucket=bucket), replicas)
            return kv
    await ensure_replicas(js, KV_STREAM_TEMPLATE.format(bucket=bucket), replicas)
    return kv


async def bucket_entries(js: JetStreamContext, bucket: str) -> list[KeyValue.Entry]:
    """Every live entry of KV ``bucket`` (none when it holds none; ``BucketNotFoundError`` when
    there is no such bucket), in key order.

    Not ``KeyValue.keys()``: nats-py marks the end of its listing when the consumer it creates
    reports nothing pending, which the server says once it has *sent* the entries, before the
    client has read them; a busy client then lists none of them and gets ``NoKeysError`` for a
    full bucket (a CI run read an empty worker registry this way). The stream's per-subject
    counts are one answer from the server's own state; each key's last entry is then read, and a
    key whose last entry deletes it is left out."""
    stream = KV_STREAM_TEMPLATE.format(bucket=bucket)
    prefix = KV_PRE_TEMPLATE.format(bucket=bucket)
    try:
        info = await js.stream_info(stream, subjects_filter=f"{prefix}>")
    except NotFoundError as exc:
        raise BucketNotFoundError from exc
    kv = await js.key_value(bucket)
    entries = []
    for subject in sorted(info.state.subjects or {}):
        try:
            entries.append(await kv.get(subject.removeprefix(prefix)))
        except (KeyDeletedError, KeyNotFoundError):  # deleted or purged since, or expired
            continue
    return entries


async def open_object_store(js: JetStreamContext, name: str, *, replicas: int = 1) -> ObjectStore:
    """Open an object store, creating it if it does not exist (race-safe and retried as
    ``open_kv``)."""
    return await retry_transient(lambda: _open_object_store(js, name, replicas), name)


async def _open_object_store(js: JetStreamContext, name: str, replicas: int) -> ObjectStore:
    try:
        store = await js.object_store(name)
    except (BucketNotFoundError, NotFoundError):
        config = ObjectStoreConfig(bucket=name, storage=StorageType.FILE, replicas=replicas)
        try:
            # nats-py overwrites config.bucket with the ``bucket`` argument, so pass both.
            store = await js.create_object_store(name, config=config)
        except BadRequestError as exc:
            store = await _open_after_failed_create(js.object_store, name, exc)
        else:
            await _wait_created(js, OBJ_STREAM_TEMPLATE.format(bucket=name), replicas)
            return store
    await ensure_replicas(js, OBJ_STREAM_TEMPLATE.format(bucket=name), replicas)
    return store


async def _wait_created(js: JetStreamContext, stream: str, replicas: int) -> None:
    """A stream just created at ``replicas`` > 1 has no leader for a moment, and a write then
    gets "no responders" (a mocker's first model upload did, and it crashed at start-up)."""
    if replicas > 1:
        await wait_leader(js, stream)


async def _open_after_failed_create(
    open_: Callable[[str], Awaitable[T]], name: str, exc: BadRequestError
) -> T:
    """The bucket another service created first; else the create's own error (which names the
    cause, e.g. "replicas > 1 not supported in non-clustered mode")."""
    try:
        return await open_(name)
    except (BucketNotFoundError, NotFoundError):
        raise exc from None


async def ensure_replicas(js: JetStreamContext, stream: str, replicas: int) -> int:
    """Scale ``stream`` up to ``replicas`` if it has fewer; return the replicas it has now.

    Never scales down: a service left at the default of 1 (or one that only reads, and so
    creates at 1 when it comes first) must not undo a cluster's replication. A raise the
    server refuses (a single server, too few peers up) is a warning, not a crash: the
    resource still works, unreplicated.
    """
    if replicas <= 1:
        return replicas
    info = await js.stream_info(stream)
    have = info.config.num_replicas or 1
    if have >= replicas:
        if info.cluster is None or not info.cluster.leader:
            await wait_leader(js, stream)  # another service created it a moment ago
        return have
    try:
        await js.update_stream(info.config.evolve(num_replicas=replicas))
    except APIError as exc:
        log.warning(
            "jetstream_replicas_not_raised",
            stream=stream,
            replicas=have,
            wanted=replicas,
            error=exc.description,
        )
        return have
    log.info("jetstream_replicas_raised", stream=stream, replicas=replicas, was=have)
    await wait_replicated(js, stream, replicas)
    return replicas


async def wait_leader(
    js: JetStreamContext, stream: str, *, timeout_s: float = REPLICATE_TIMEOUT_S
) -> bool:
    """Wait until ``stream`` has a leader (it takes writes); False, and a warning, past
    ``timeout_s``. Unlike ``wait_replicated`` it does not wait for every peer: a service
    started while one node is down must not wait for it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            cluster = (await js.stream_info(stream)).cluster
        except (APIError, nats.errors.TimeoutError):
            cluster = None
        if cluster is None or cluster.leader:  # no cluster info: a single server
            return True
        await asyncio.sleep(REPLICATE_POLL_S)
    log.warning("jetstream_no_leader", stream=stream, waited_s=timeout_s)
    return False


async def wait_replicated(
    js: JetStreamContext, stream: str, replicas: int, *, timeout_s: float = REPLICATE_TIMEOUT_S
) -> bool:
    """Wait until ``stream`` has a leader and ``replicas - 1`` current followers.

    Right after a scale-up the group elects a leader and the new peers catch up; a write in
    that window can time out (a worker's first heartbeat did, and the worker crashed). False,
    and a warning, when that takes longer than ``timeout_s``: the stream still works.
    """
    deadline = time.monotonic() + timeout_s
    current = 0
    while time.monotonic() < deadline:
        try:
            cluster = (await js.stream_info(stream)).cluster
        except (APIError, nats.errors.TimeoutError):  # no leader yet
            cluster = None
        if cluster is not None and cluster.leader:
            peers = cluster.replicas or []
            current = 1 + sum(1 for p in peers if p.current and not p.offline)
            if current >= replicas:
                return True
        await asyncio.sleep(REPLICATE_POLL_S)
    log.warning("jetstream_replicas_not_current", stream=stream, replicas=replicas, current=current)
    return False


async def read_object(store: ObjectStore, name: str) -> bytes | None:
    """An object's bytes (``None`` if there is none), each attempt bounded by a timeout.

    The timeout grows with the object's size: a 158-byte card read while another worker
    re-uploaded it used to wait 10 s for chunks that were gone, and the requests waiting for
    that model's card timed out behind it.
    """
    for attempt in range(1, FETCH_ATTEMPTS + 1):
        try:
            info = await asyncio.wait_for(store.get_info(name), FETCH_BASE_S)
            timeout_s = fetch_timeout_s(info.size or 0)
            result = await asyncio.wait_for(store.get(name), timeout_s)
        except (ObjectNotFoundError, NotFoundError):
            return None
        except TimeoutError:
            # Another worker re-uploaded the object while we read it (its old chunks are
            # purged, and nats-py waits for them forever): read the new version.
            log.warning("model_file_read_timed_out", name=name, attempt=attempt)
            continue
        return result.data or b""
    raise TimeoutError(f"could not read {name} from the model registry")


def fetch_timeout_s(size: int) -> float:
    """How long one read of a ``size``-byte object may take."""
    return FETCH_BASE_S + size / FETCH_MIN_BYTES_PER_S


async def object_digest(store: ObjectStore, name: str) -> str | None:
    """The digest the store reports for ``name`` (``None`` if there is no such object)."""
    try:
        info = await store.get_info(name)
    except (ObjectNotFoundError, NotFoundError):
        return None
    digest: str | None = info.digest
    return digest


def content_digest(data: bytes) -> str:
    """An object's digest as the object store reports it (``SHA-256=`` + base64url)."""
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
