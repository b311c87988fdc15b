"""``jetserve tap --since-seq / --since``: replaying a JetStream stream on a real server."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import nats
import pytest
from nats.js.api import StorageType

from services.cli.tap import TapOptions, tap
from shared import codec
from shared.messages import AllBlocksCleared, KvEventBatch
from shared.subjects import Subjects


@pytest.fixture
async def kv_stream(nats_url: str, subjects: Subjects) -> None:
    """A KV events stream holding three batches from two workers."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=subjects.kv_stream, subjects=[subjects.kv_events_all])
        for worker, event_id in (("w1", 1), ("w2", 1), ("w1", 2)):
            batch = KvEventBatch(worker_id=worker, event_id=event_id, events=(AllBlocksCleared(),))
            await js.publish(subjects.kv_events(worker), codec.encode(batch))
    finally:
        await nc.close()


async def _tap(**options: object) -> tuple[int, list[dict[str, object]]]:
    out = io.BytesIO()
    code = await tap(TapOptions(**options), out)  # type: ignore[arg-type]
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.usefixtures("kv_stream")
async def test_since_seq_replays_the_stream_in_order(nats_url: str, subjects: Subjects) -> None:
    code, lines = await _tap(
        subjects=(f"{subjects.namespace}.v1.>",),
        nats_url=nats_url,
        since_seq=1,
        count=3,
        timeout_s=10,
    )
    assert code == 0
    assert [ln["seq"] for ln in lines] == [1, 2, 3]
    assert {ln["type"] for ln in lines} == {"KvEventBatch"}
    assert lines[2]["fields"] == {
        "worker_id": "w1",
        "event_id": 2,
        "events": [{"type": "AllBlocksCleared", "dp_rank": 0}],  # every field, as decoded
        "ts": 0.0,
    }


@pytest.mark.usefixtures("kv_stream")
async def test_since_a_time_filters_by_subject(nats_url: str, subjects: Subjects) -> None:
    code, lines = await _tap(
        subjects=(subjects.kv_events("w1"),),
        nats_url=nats_url,
        since=datetime.now(UTC) - timedelta(minutes=5),
        count=2,
        timeout_s=10,
    )
    assert code == 0
    assert [ln["fields"]["event_id"] for ln in lines] == [1, 2]  # type: ignore[index]


async def test_since_on_a_subject_no_stream_holds_is_an_error(
    nats_url: str, subjects: Subjects
) -> None:
    code, lines = await _tap(
        subjects=(subjects.preprocess,), nats_url=nats_url, since_seq=1, timeout_s=5
    )
    assert (code, lines) == (1, [])


@pytest.mark.usefixtures("kv_stream")
async def test_count_not_reached_before_the_timeout_exits_1(
    nats_url: str, subjects: Subjects
) -> None:
    code, lines = await _tap(
        subjects=(subjects.kv_events_all,), nats_url=nats_url, since_seq=1, count=5, timeout_s=1
    )
    assert (code, len(lines)) == (1, 3)


async def test_replay_finds_streams_past_the_first_page_of_the_stream_list(
    nats_url: str, subjects: Subjects
) -> None:
    """The server lists streams 256 at a time; every stream holding the subjects is replayed."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for i in range(260):
            await js.add_stream(
                name=f"{subjects.namespace}_many_{i:03d}",
                subjects=[f"{subjects.namespace}.v1.many.{i}"],
                storage=StorageType.MEMORY,
            )
            await js.publish(f"{subjects.namespace}.v1.many.{i}", codec.encode(AllBlocksCleared()))
    finally:
        await nc.close()
    code, lines = await _tap(
        subjects=(f"{subjects.namespace}.v1.many.*",),
        nats_url=nats_url,
        since_seq=1,
        count=260,
        timeout_s=20,
    )
    assert (code, len(lines)) == (0, 260)
    assert len({ln["subject"] for ln in lines}) == 260
