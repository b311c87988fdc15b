"""Registry buckets and model uploads: services that start together may all do them at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
import structlog
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError

from shared.messages import ModelCard, WorkerCard
from shared.registry import (
    ModelFiles,
    content_digest,
    open_kv,
    open_object_store,
    publish_model,
    upload_lease_key,
)
from shared.registry.jetstream import bucket_entries
from shared.registry.writer import WorkerRegistration
from shared.subjects import Subjects


async def test_concurrent_creators_with_different_ttls_share_one_bucket(
    nc: Client, subjects: Subjects
) -> None:
    js = nc.jetstream()
    buckets = await asyncio.gather(
        *(open_kv(js, subjects.workers_bucket, ttl_s=float(ttl)) for ttl in range(2, 10))
    )
    await buckets[0].put("k", b"v")
    assert [(await b.get("k")).value for b in buckets] == [b"v"] * 8


async def test_concurrent_creators_share_one_object_store(nc: Client, subjects: Subjects) -> None:
    js = nc.jetstream()
    stores = await asyncio.gather(*(open_object_store(js, subjects.models_store) for _ in range(8)))
    await stores[0].put("f", b"data")
    assert [(await s.get("f")).data for s in stores] == [b"data"] * 8


async def test_a_buckets_listing_holds_its_live_entries_only(
    nc: Client, subjects: Subjects
) -> None:
    """``bucket_entries``: no bucket is an error, an empty one lists nothing, and a key deleted
    or purged is left out (its marker is still a subject of the stream)."""
    js = nc.jetstream()
    with pytest.raises(BucketNotFoundError):
        await bucket_entries(js, subjects.workers_bucket)
    kv = await open_kv(js, subjects.workers_bucket, ttl_s=0)
    assert await bucket_entries(js, subjects.workers_bucket) == []
    for key in ("c", "a", "gone", "b", "purged"):
        await kv.put(key, key.encode())
    await kv.put("a", b"a2")
    await kv.delete("gone")
    await kv.purge("purged")
    listed = await bucket_entries(js, subjects.workers_bucket)
    assert [(e.key, e.value) for e in listed] == [("a", b"a2"), ("b", b"b"), ("c", b"c")]


async def test_a_card_updated_after_its_worker_left_is_not_put_back(
    nc: Client, subjects: Subjects
) -> None:
    """A LoRA load answered while the worker withdraws (an unhealthy engine, a drain) must not
    register it again."""
    js = nc.jetstream()
    card = WorkerCard(worker_id="w1", model="m")
    registration = WorkerRegistration(js, subjects, card)
    await registration.start()
    await registration.update(msgspec.structs.replace(card, max_loras=2))
    assert [e.key for e in await bucket_entries(js, subjects.workers_bucket)] == ["w1"]
    await registration.stop()
    await registration.update(msgspec.structs.replace(card, max_loras=3))
    assert await bucket_entries(js, subjects.workers_bucket) == []


def _tiny_model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text('{"vocab_size": 10}')
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return tmp_path


async def test_workers_starting_together_upload_each_file_once(
    nc: Client, subjects: Subjects, tmp_path: Path
) -> None:
    """A second put of an object purges the chunks a reader may be fetching: one uploads."""
    card = ModelCard(model="m/tiny", context_length=64, eos_token_ids=(1,))
    model_dir = _tiny_model(tmp_path)
    with structlog.testing.capture_logs() as logs:
        await asyncio.gather(
            *(publish_model(nc.jetstream(), subjects, card, model_dir) for _ in range(4))
        )
    uploaded = sorted(e["name"] for e in logs if e["event"] == "model_file_uploaded")
    assert uploaded == ["m/tiny/card", "m/tiny/config.json", "m/tiny/tokenizer_config.json"]
    files = ModelFiles(nc.jetstream(), subjects)
    assert await files.get("m/tiny", "config.json") == b'{"vocab_size": 10}'


async def test_a_lease_whose_uploader_died_is_waited_out(
    nc: Client, subjects: Subjects, tmp_path: Path
) -> None:
    card = ModelCard(model="m/orphan", context_length=64, eos_token_ids=(1,))
    model_dir = _tiny_model(tmp_path)
    leases = await open_kv(nc.jetstream(), subjects.model_uploads_bucket, 0.5)
    data = (model_dir / "config.json").read_bytes()
    await leases.create(upload_lease_key("m/orphan/config.json", content_digest(data)), b"")
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        await publish_model(nc.jetstream(), subjects, card, model_dir, lease_s=0.5)
    assert time.monotonic() - started >= 0.5
    events = [(e["event"], e["name"]) for e in logs if e["event"].startswith("model_")]
    assert ("model_upload_lease_expired", "m/orphan/config.json") in events
    assert ("model_file_uploaded", "m/orphan/config.json") in events
    assert await ModelFiles(nc.jetstream(), subjects).get("m/orphan", "config.json") == data


async def test_a_card_that_differs_only_in_created_is_not_uploaded_again(
    nc: Client, subjects: Subjects, tmp_path: Path
) -> None:
    """Workers started a second apart used to re-upload the card (CI: a read then hung 10 s)."""
    model_dir = _tiny_model(tmp_path)
    first = ModelCard(model="m/stamped", context_length=64, created=1000)
    await publish_model(nc.jetstream(), subjects, first, model_dir)
    with structlog.testing.capture_logs() as logs:
        later = msgspec.structs.replace(first, created=2000)
        await publish_model(nc.jetstream(), subjects, later, model_dir)
        changed = msgspec.structs.replace(first, created=3000, context_length=128)
        await publish_model(nc.jetstream(), subjects, changed, model_dir)
    uploaded = [e["name"] for e in logs if e["event"] == "model_file_uploaded"]
    assert uploaded == ["m/stamped/card"]  # the changed card only
    card = await ModelFiles(nc.jetstream(), subjects).card("m/stamped")
    assert card is not None
    assert (card.created, card.context_length) == (3000, 128)
