"""The busy-thresholds KV bucket (``POST /busy_threshold``): each model's thresholds, written by
gateways and read by routers at start, so a router (re)started after a change applies it.

A value is a ``BusyThresholdsChanged`` keyed by ``busy_thresholds_key(model)``; clearing every
threshold of a model stores one with all three ``None`` (not a delete: a put returns the
revision that orders it against the broadcast, ``services.router.thresholds``).
"""

from __future__ import annotations

import msgspec
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from shared import codec
from shared.messages import BusyThresholdsChanged
from shared.registry.jetstream import bucket_entries, open_kv, retry_transient
from shared.subjects import Subjects, busy_thresholds_key


def is_cleared(message: BusyThresholdsChanged) -> bool:
    """Whether ``message`` sets no threshold (the routers' own settings apply)."""
    return (
        message.active_decode_blocks_threshold is None
        and message.active_prefill_tokens_threshold is None
        and message.active_prefill_tokens_threshold_frac is None
    )


async def store(
    js: JetStreamContext, subjects: Subjects, message: BusyThresholdsChanged, *, replicas: int = 1
) -> BusyThresholdsChanged:
    """Put ``message`` under its model (creating the bucket); it comes back with its revision."""
    kv = await open_kv(js, subjects.busy_thresholds_bucket, 0, replicas=replicas)
    unrevised = msgspec.structs.replace(message, revision=0)
    revision = await kv.put(busy_thresholds_key(message.model), codec.encode(unrevised))
    return msgspec.structs.replace(message, revision=revision)


async def stored(js: JetStreamContext, subjects: Subjects) -> list[BusyThresholdsChanged]:
    """Every model's entry, each with its revision (none yet, or no bucket yet: empty)."""
    try:
        entries = await retry_transient(
            lambda: bucket_entries(js, subjects.busy_thresholds_bucket), "busy_thresholds"
        )
    except BucketNotFoundError:
        return []
    return [m for m in map(_decoded, entries) if m is not None]


async def stored_for(
    js: JetStreamContext, subjects: Subjects, model: str
) -> BusyThresholdsChanged | None:
    """One model's entry (``None``: never set)."""
    try:
        kv = await js.key_value(subjects.busy_thresholds_bucket)
    except BucketNotFoundError:
        return None
    return await _entry(kv, busy_thresholds_key(model))


async def _entry(kv: KeyValue, key: str) -> BusyThresholdsChanged | None:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return _decoded(entry)


def _decoded(entry: KeyValue.Entry) -> BusyThresholdsChanged | None:
    if entry.value is None or entry.revision is None:
        return None
    try:
        message = codec.decode(entry.value, BusyThresholdsChanged)
    except codec.DecodeError:
        return None  # not ours (written by hand): nothing to apply
    return msgspec.structs.replace(message, revision=entry.revision)
