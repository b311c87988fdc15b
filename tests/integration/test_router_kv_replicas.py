"""Two KV-router replicas fed the same events agree: same index, same load, same choices."""

from __future__ import annotations

from nats.aio.client import Client

from shared import codec
from shared.hashing import prefix_hashes
from shared.messages import Cancel, RequestPhase
from shared.subjects import Subjects
from tests.integration.router_kv_support import (
    MODEL,
    EventPublisher,
    caught_up,
    fake_workers,
    generate,
    running_router,
    until,
)

WORKERS = ("w1", "w2", "w3", "w4")
PREFIXES = [tuple(range(10_000 * (p + 1), 10_000 * (p + 1) + 16 * 12)) for p in range(3)]


async def test_two_replicas_route_the_same_requests_identically(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    events = EventPublisher(nc, subjects)
    await events.ensure_stream()
    async with (
        fake_workers(nc, subjects, *WORKERS),
        running_router(nats_url, subjects) as a,
        running_router(nats_url, subjects) as b,
    ):
        await until(lambda: len(a.live(MODEL)) == 4 and len(b.live(MODEL)) == 4, what="workers")
        await events.store("w1", prefix_hashes(PREFIXES[0], 16)[:10])
        await events.store("w2", prefix_hashes(PREFIXES[1], 16)[:6])
        await events.store("w3", prefix_hashes(PREFIXES[0], 16)[:3])
        await caught_up(a, events.last_seq)
        await caught_up(b, events.last_seq)
        assert a.core.sync.index.state() == b.core.sync.index.state()

        chosen: list[str] = []
        for i in range(24):
            prompt = (*PREFIXES[i % 3], *range(i * 7, i * 7 + 20))
            gen = generate(prompt, request_id=f"req-{i}")
            live = a.live(MODEL)
            plan_a = a.core.decide(gen, live, now=0, rng=a.rng_for(gen.request_id))
            plan_b = b.core.decide(gen, live, now=0, rng=b.rng_for(gen.request_id))
            assert (plan_a.worker_id, plan_a.candidates) == (plan_b.worker_id, plan_b.candidates)
            chosen.append(plan_a.worker_id)
            # route it for real through the queue group: one replica decides, the other follows
            await nc.publish(subjects.route, codec.encode(gen))

            def both_count(rid: str = gen.request_id) -> bool:
                return rid in a.core.load and rid in b.core.load

            await until(both_count, what=f"both replicas to count {gen.request_id}")
            if i % 4 == 3:  # some requests finish, some are cancelled
                await nc.publish(
                    subjects.lifecycle("w1"),
                    codec.encode(
                        RequestPhase(request_id=f"req-{i - 1}", worker_id="?", phase="finished")
                    ),
                )
                await nc.publish(subjects.cancel, codec.encode(Cancel(request_id=f"req-{i - 2}")))
        await until(lambda: len(a.core.load) == len(b.core.load) == 24 - 12, what="ends applied")
        for w in WORKERS:
            assert a.core.load.decode_blocks(w) == b.core.load.decode_blocks(w)
            assert a.core.load.prefill_tokens(w) == b.core.load.prefill_tokens(w)
    assert len(set(chosen)) >= 3, chosen  # load spreads requests beyond the cache holders


async def test_only_one_replica_holds_the_snapshot_lease(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    events = EventPublisher(nc, subjects)
    await events.ensure_stream()
    async with (
        running_router(nats_url, subjects, lease_ttl_s=1.0) as a,
        running_router(nats_url, subjects, lease_ttl_s=1.0) as b,
    ):
        assert a.snapshots is not None
        assert b.snapshots is not None
        lease_a, lease_b = a.snapshots.lease, b.snapshots.lease
        assert lease_a is not None
        assert lease_b is not None
        assert await lease_a.refresh()
        assert not await lease_b.refresh()
        assert await lease_a.refresh()  # renewal with the revision check
        await lease_a.release()
        assert await lease_b.refresh()
        assert not await lease_a.refresh()
