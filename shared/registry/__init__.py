"""The model registry on JetStream: worker cards in a KV bucket, model files in an object store.

Workers register (``writer.WorkerRegistration``) and publish their model's files
(``writer.publish_model``, or ``writer.publish_model_card`` for a tensor model, which has
none); every other service reads through ``reader.WorkerDirectory`` and
``model_files.ModelFiles``. ``layout`` says where each thing is kept; ``jetstream`` holds the
bucket, object-store and bounded-read helpers.
"""

from shared.registry.jetstream import content_digest, open_kv, open_object_store
from shared.registry.layout import DEFAULT_WORKER_TTL_S
from shared.registry.model_files import ModelFiles
from shared.registry.reader import WorkerDirectory, is_live
from shared.registry.writer import (
    WorkerRegistration,
    publish_model,
    publish_model_card,
    upload_lease_key,
)

__all__ = [
    "DEFAULT_WORKER_TTL_S",
    "ModelFiles",
    "WorkerDirectory",
    "WorkerRegistration",
    "content_digest",
    "is_live",
    "open_kv",
    "open_object_store",
    "publish_model",
    "publish_model_card",
    "upload_lease_key",
]
