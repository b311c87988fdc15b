"""Registry buckets: services that start together may all create them at once."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from shared.registry import open_kv, open_object_store
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
