"""KV-aware router against a real nats-server, fed with hand-made KV events and fake workers."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.aio.msg import Msg
from structlog.testing import capture_logs

from services.router.sync import KvSync
from shared import codec
from shared.hashing import prefix_hashes
from shared.messages import (
    BlockStored,
    KvDump,
    KvDumpRequest,
    KvEventBatch,
    RouteDecision,
)
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

PROMPT = tuple(range(7000, 7000 + 16 * 10))
H = prefix_hashes(PROMPT, 16)


async def test_kv_mode_sends_a_request_to_the_worker_holding_its_prefix(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    events = EventPublisher(nc, subjects)
    await events.ensure_stream()
    decisions = await nc.subscribe(subjects.decisions)
    async with (
        fake_workers(nc, subjects, "w1", "w2", "w3") as workers,
        running_router(nats_url, subjects) as router,
    ):
        await until(lambda: len(router.live(MODEL)) == 3, what="3 live workers")
        await events.store("w2", H[:6])
        await events.store("w3", H[:2])
        await caught_up(router, events.last_seq)
        gen = generate((*PROMPT, 1, 2, 3))
        await nc.publish(subjects.route, codec.encode(gen))
        routed = await asyncio.wait_for(workers[1].received.get(), 5)
        decision = codec.decode((await decisions.next_msg(timeout=5)).data, RouteDecision)
    assert (routed.request_id, routed.worker_id) == (gen.request_id, "w2")
    assert (decision.worker_id, decision.overlap_blocks, decision.mode) == ("w2", 6, "kv")
    assert {c.worker_id: c.overlap_blocks for c in decision.candidates} == {
        "w1": 0,
        "w2": 6,
        "w3": 2,
    }


async def test_restarted_router_rebuilds_an_identical_index_from_snapshot_and_stream(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    events = EventPublisher(nc, subjects)
    await events.ensure_stream()
    async with fake_workers(nc, subjects, "w1", "w2"):
        async with running_router(nats_url, subjects) as first:
            await events.store("w1", H[:4])
            await events.store("w2", H[:2])
            await events.store("w1", H[4:6], parent=H[3])
            await caught_up(first, events.last_seq)
            assert first.snapshots is not None
            assert await first.snapshots.lease.refresh()  # type: ignore[union-attr]
            assert await first.snapshots.write(force=True)
            snapshot_seq = first.core.sync.stream_seq
            # more events after the snapshot: the restarted router must replay them
            await events.store("w2", H[2:5], parent=H[1])
            await events.publish("w1", BlockStored(block_hashes=(H[6],), parent_hash=H[5]))
        # Drop what the snapshot covers from the stream: only snapshot + replay can rebuild it.
        await nc.jetstream().purge_stream(subjects.kv_stream, seq=snapshot_seq + 1)
        await events.store("w2", H[5:8], parent=H[4])
        async with running_router(nats_url, subjects) as second:
            await caught_up(second, events.last_seq)
            rebuilt = second.core.sync.index.state()
    assert rebuilt == {"w1": frozenset(H[:7]), "w2": frozenset(H[:8])}


async def test_a_worker_leaving_the_registry_loses_its_blocks(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    events = EventPublisher(nc, subjects)
    await events.ensure_stream()
    async with (
        fake_workers(nc, subjects, "w1", "w2") as workers,
        running_router(nats_url, subjects) as router,
    ):
        await until(lambda: len(router.live(MODEL)) == 2, what="2 live workers")
        await events.store("w1", H[:5])
        await events.store("w2", H[:3])
        await caught_up(router, events.last_seq)
        assert router.core.sync.index.find_matches(H) == {"w1": 5, "w2": 3}
        await workers[0].leave()
        await until(lambda: router.core.sync.index.workers() == ["w2"], what="w1 dropped")
        assert router.core.sync.index.find_matches(H) == {"w2": 3}


async def test_an_event_gap_triggers_a_dump_that_repairs_the_index(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    events = EventPublisher(nc, subjects)
    await events.ensure_stream()
    asked: list[KvDumpRequest] = []

    async def dump_responder(msg: Msg) -> None:
        asked.append(codec.decode(msg.data, KvDumpRequest))
        dump = KvDump(worker_id="w1", event_id=4, events=(BlockStored(block_hashes=tuple(H[:7])),))
        await msg.respond(codec.encode(dump))

    await nc.subscribe(subjects.kv_dump("w1"), cb=dump_responder)
    async with (
        fake_workers(nc, subjects, "w1"),
        running_router(nats_url, subjects) as router,
    ):
        await events.store("w1", H[:2])  # event_id 1
        # event_ids 2 and 3 are lost: 4 is a gap
        await events.publish("w1", BlockStored(block_hashes=(H[6],)), event_id=4)
        await until(lambda: router.core.sync.last_event_id.get("w1") == 4, what="dump applied")
        assert router.core.sync.index.find_matches(H) == {"w1": 7}
        await events.store("w1", H[7:9], parent=H[6])  # event_id 5 follows the dump
        await caught_up(router, events.last_seq)
        assert router.core.sync.index.find_matches(H) == {"w1": 9}
    assert [a.router_id for a in asked] == [router.router_id]
    assert router.metrics.dumps.labels("applied")._value.get() == 1


async def test_router_index_equals_a_pure_replay_of_the_stream(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    events = EventPublisher(nc, subjects)
    await events.ensure_stream()
    await events.store("w1", H[:3])
    await events.store("w1", H[3:5], parent=H[2])
    await events.store("w2", H[:1])
    async with fake_workers(nc, subjects, "w1", "w2"), running_router(nats_url, subjects) as r:
        await caught_up(r, events.last_seq)
        live = r.core.sync.index.state()
    expected = KvSync()
    for i, (worker, hashes) in enumerate([("w1", H[:3]), ("w1", H[3:5]), ("w2", H[:1])]):
        eid = 1 if worker == "w2" else i + 1
        batch = KvEventBatch(
            worker_id=worker, event_id=eid, events=(BlockStored(block_hashes=tuple(hashes)),)
        )
        expected.on_batch(batch)
    assert live == expected.index.state()


async def test_an_undecodable_batch_is_logged_counted_and_skipped(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    events = EventPublisher(nc, subjects)
    await events.ensure_stream()
    async with fake_workers(nc, subjects, "w1"), running_router(nats_url, subjects) as router:
        with capture_logs() as logs:
            ack = await nc.jetstream().publish(subjects.kv_events("w1"), b"\xc1 not msgpack")
            await caught_up(router, ack.seq)
        await events.store("w1", H[:2])  # the feed goes on
        await caught_up(router, events.last_seq)
        assert router.core.sync.index.find_matches(H) == {"w1": 2}
    (logged,) = [e for e in logs if e["event"] == "message_undecodable"]
    assert (logged["kind"], logged["seq"]) == ("kv_event_batch", ack.seq)
    errors = router.metrics.base.errors.labels("router", "message_undecodable")
    assert errors._value.get() == 1
