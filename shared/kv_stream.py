"""The KV-events JetStream stream: one definition that workers and routers both ensure.

``<NS>_KV_EVENTS`` holds every worker's ``KvEventBatch`` on ``<ns>.v1.kv.<worker_id>``, kept
by age and size (a router that falls behind retention asks workers for dumps). Creating it is
idempotent: an existing stream with other limits is updated to these.
"""

from __future__ import annotations

import structlog
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig, StreamInfo
from nats.js.client import JetStreamContext
from nats.js.errors import BadRequestError

from shared.subjects import Subjects

log = structlog.get_logger(__name__)

DEFAULT_MAX_AGE_S = 3600.0
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DUPLICATE_WINDOW_S = 120.0
"""Workers set ``Nats-Msg-Id`` per batch, so a retried publish is stored once."""
STREAM_NAME_IN_USE = 10058
"""JetStream's error code for "stream name already in use with a different configuration"."""


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
    """Create the KV-events stream, or update its limits if it exists with others."""
    config = kv_stream_config(subjects, max_age_s=max_age_s, max_bytes=max_bytes, replicas=replicas)
    try:
        return await js.add_stream(config)
    except BadRequestError as exc:
        if exc.err_code != STREAM_NAME_IN_USE:
            raise
    info = await js.update_stream(config)
    log.info("kv_stream_updated", stream=config.name, max_age_s=max_age_s, max_bytes=max_bytes)
    return info
