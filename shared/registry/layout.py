"""Where the registry keeps what: the workers bucket, the models object store, object names."""

from __future__ import annotations

from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from shared.registry.jetstream import OPEN_BUDGET_S, open_kv, open_object_store
from shared.subjects import Subjects

DEFAULT_WORKER_TTL_S = 10.0
MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")
"""The files of a model directory a worker publishes (those it has)."""
CARD = "card"
"""The object holding a model's ``ModelCard``, beside its files."""


def object_name(model: str, file: str) -> str:
    """Object-store name of one file of one model."""
    return f"{model}/{file}"


async def workers_bucket(
    js: JetStreamContext,
    subjects: Subjects,
    ttl_s: float,
    *,
    replicas: int = 1,
    retry_s: float = OPEN_BUDGET_S,
) -> KeyValue:
    """Open the workers KV bucket, creating it (max age = ``ttl_s``) if it does not exist
    (``retry_s``: see ``open_kv``)."""
    return await open_kv(js, subjects.workers_bucket, ttl_s, replicas=replicas, retry_s=retry_s)


async def models_store(
    js: JetStreamContext, subjects: Subjects, *, replicas: int = 1
) -> ObjectStore:
    """Open the models object store, creating it if it does not exist."""
    return await open_object_store(js, subjects.models_store, replicas=replicas)
