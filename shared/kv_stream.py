"""The KV-events JetStream stream: one definition that workers and routers both ensure.

``<NS>_KV_EVENTS`` holds every worker's ``KvEventBatch`` on ``<ns>.v1.kv.<worker_id>``, kept
by age and size (a router that falls behind retention asks workers for dumps). Creating it is
idempotent: an existing stream with other limits is updated to these, and its replicas are only
ever raised.
"""

from __future__ import annotations

import structlog
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig, StreamInfo
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from shared.registry.jetstream import wait_leader, wait_replicated
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

DEFAULT_MAX_AGE_S = 3600.0
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DUPLICATE_WINDOW_S = 120.0
"""Workers set ``Nats-Msg-Id`` per batch, so a retried publish is stored once."""


def kv_stream_config(
    subjects: Subjects,
    *,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
    replicas: int = 1,
) -> StreamConfig:
    """The stream's configuration: limits retention, file storage, old messages go first."""
    return StreamConfig(
        name=subjects.kv_stream,
        subjects=[subjects.kv_events_all],
        retention=RetentionPolicy.LIMITS,
        max_age=max_age_s,
        max_bytes=max_bytes,
        discard=DiscardPolicy.OLD,
        storage=StorageType.FILE,
        duplicate_window=min(DUPLICATE_WINDOW_S, max_age_s),  # the server requires <= max age
        num_replicas=replicas,
    )


async def ensure_kv_stream(
    js: JetStreamContext,
    subjects: Subjects,
    *,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
    replicas: int = 1,
) -> StreamInfo:
    """Create the KV-events stream, or update its limits if it exists with others.

    An existing stream keeps its replicas when it has more than ``replicas`` (a router left at
    the default must not undo a cluster's R3); it is scaled up when it has fewer and the server
    allows, else that is a warning and the limits are updated all the same.
    """
    config = kv_stream_config(subjects, max_age_s=max_age_s, max_bytes=max_bytes, replicas=replicas)
    try:
        info = await js.add_stream(config)
    except APIError as exc:
        # "Name already in use" (other limits), or "replicas > 1 not supported" for a stream
        # that exists: update it below. Any other failure of a stream that does not exist is
        # the add's own error.
        try:
            existing = await js.stream_info(config.name or "")
        except NotFoundError:
            raise exc from None
    else:
        if replicas > 1:  # a new replicated stream has no leader for a moment
            await wait_leader(js, info.config.name or "")
        return info
    have = existing.config.num_replicas or 1
    if have > replicas:
        config = config.evolve(num_replicas=have)
    try:
        info = await js.update_stream(config)
    except APIError as exc:
        if have >= replicas:
            raise
        log.warning(
            "jetstream_replicas_not_raised",
            stream=config.name,
            replicas=have,
            wanted=replicas,
            error=exc.description,
        )
        info = await js.update_stream(config.evolve(num_replicas=have))
    if (info.config.num_replicas or 1) > have:
        await wait_replicated(js, info.config.name or "", replicas)
    log.info(
        "kv_stream_updated",
        stream=config.name,
        max_age_s=max_age_s,
        max_bytes=max_bytes,
        replicas=info.config.num_replicas,
    )
    return info
