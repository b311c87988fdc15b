"""JetStream helpers: race-safe bucket and object-store creation, bounded object reads, digests."""

from __future__ import annotations

import asyncio
import base64
import hashlib

import structlog
from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError, ObjectNotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

log = structlog.get_logger(__name__)

FETCH_TIMEOUT_S = 10.0
FETCH_ATTEMPTS = 3


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


async def read_object(store: ObjectStore, name: str) -> bytes | None:
    """An object's bytes (``None`` if there is none), each attempt bounded by a timeout."""
    for attempt in range(1, FETCH_ATTEMPTS + 1):
        try:
            result = await asyncio.wait_for(store.get(name), FETCH_TIMEOUT_S)
        except (ObjectNotFoundError, NotFoundError):
            return None
        except TimeoutError:
            # Another worker re-uploaded the object while we read it (its old chunks are
            # purged, and nats-py waits for them forever): read the new version.
            log.warning("model_file_read_timed_out", name=name, attempt=attempt)
            continue
        return result.data or b""
    raise TimeoutError(f"could not read {name} from the model registry")


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
