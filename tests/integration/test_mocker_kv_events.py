"""The mocker against a real nats-server: KV events in JetStream, dumps, load and lifecycle."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from structlog.testing import capture_logs

from services.mocker.service import ModelInfo
from shared import codec
from shared.hashing import prefix_hashes
from shared.kv_stream import ensure_kv_stream
from shared.messages import (
    AllBlocksCleared,
    BlockStored,
    Generate,
    KvDump,
    KvDumpRequest,
    KvEventBatch,
    RequestFailed,
    RequestPhase,
    RoutingHints,
    SamplingParams,
    TokenBatch,
    WorkerLoad,
)
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.subjects import Subjects
from tests.integration.mocker_support import running_mocker
from tests.support import eventually_async, eventually_awaited

BS = 16
PROMPT = tuple(range(100, 140))  # 40 tokens: 2 full blocks


async def _dump(nc: Client, subjects: Subjects, worker_id: str) -> KvDump:
    """Ask for a dump, retrying while the worker's subscription is not visible yet."""

    async def answer() -> KvDump | None:
        request = codec.encode(KvDumpRequest(router_id="test"))
        try:
            reply = await nc.request(subjects.kv_dump(worker_id), request, timeout=2)
        except NoRespondersError:
            return None
        return codec.decode(reply.data, KvDump)

    return await eventually_awaited(answer, message="the worker never answered kv_dump")


async def _generate(
    nc: Client, subjects: Subjects, worker_id: str, prompt: tuple[int, ...], **routing: Any
) -> list[TokenBatch]:
    """Send one request straight to the worker; return its token batches."""
    request_id = uuid.uuid4().hex
    stream_to = subjects.stream("f1", request_id)
    sub = await nc.subscribe(stream_to)
    gen = Generate(
        request_id=request_id,
        model=DEFAULT_MODEL_NAME,
        token_ids=prompt,
        sampling=SamplingParams(max_tokens=4, ignore_eos=True),
        stream_to=stream_to,
        routing=RoutingHints(**routing) if routing else None,
    )
    await nc.publish(subjects.generate(worker_id), codec.encode(gen))
    batches: list[TokenBatch] = []
    while not batches or batches[-1].finish_reason is None:
        msg = await sub.next_msg(timeout=5)
        batches.append(codec.decode(msg.data, TokenBatch))
    await sub.unsubscribe()
    return batches


async def _stream_batches(nc: Client, subjects: Subjects) -> list[KvEventBatch]:
    js = nc.jetstream()
    info = await js.stream_info(subjects.kv_stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg(subjects.kv_stream, seq)
        assert msg.data is not None
        out.append(codec.decode(msg.data, KvEventBatch))
    return out


async def test_kv_events_land_in_the_stream_in_order(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with running_mocker(nats_url, subjects, model_info, worker_id="w") as mocker:
        await _dump(nc, subjects, "w")  # ready
        for prompt in (PROMPT, PROMPT, tuple(range(500, 540))):
            await _generate(nc, subjects, "w", prompt)
        publisher = mocker.workers[0].publisher
        await eventually_async(lambda: len(publisher.events) == 0, message="KV events left unsent")
        batches = await _stream_batches(nc, subjects)
    assert [b.event_id for b in batches] == list(range(1, len(batches) + 1))
    assert {b.worker_id for b in batches} == {"w"}
    assert batches[0].events[0] == AllBlocksCleared()
    stored = [e for b in batches for e in b.events if isinstance(e, BlockStored)]
    first = stored[0]
    assert (first.parent_hash, first.block_size) == (None, BS)
    assert list(first.block_hashes[:2]) == prefix_hashes(PROMPT, BS)
    assert first.token_ids[: 2 * BS] == PROMPT[: 2 * BS]
    all_hashes = [h for e in stored for h in e.block_hashes]
    assert len(all_hashes) == len(set(all_hashes))  # the repeated prompt stored nothing new


async def test_second_request_reports_cached_tokens_and_salts_do_not_share(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with running_mocker(nats_url, subjects, model_info, worker_id="w"):
        await _dump(nc, subjects, "w")
        cold = await _generate(nc, subjects, "w", PROMPT)
        warm = await _generate(nc, subjects, "w", PROMPT)
        salted = await _generate(nc, subjects, "w", PROMPT, cache_salt="tenant-x")
    assert (cold[0].cached_tokens, warm[0].cached_tokens, salted[0].cached_tokens) == (0, 32, 0)
    assert warm[0].prompt_tokens == len(PROMPT)


async def test_kv_dump_returns_cached_blocks_as_of_the_event_id(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with running_mocker(nats_url, subjects, model_info, worker_id="w") as mocker:
        await _dump(nc, subjects, "w")
        await _generate(nc, subjects, "w", PROMPT)
        await _generate(nc, subjects, "w", PROMPT, cache_salt="s")
        dump = await _dump(nc, subjects, "w")
        publisher = mocker.workers[0].publisher
        await eventually_async(lambda: len(publisher.events) == 0, message="KV events left unsent")
        batches = await _stream_batches(nc, subjects)
    assert dump.worker_id == "w"
    assert dump.event_id == batches[-1].event_id
    dumped = {h for e in dump.events for h in e.block_hashes}
    streamed = {
        h for b in batches for e in b.events if isinstance(e, BlockStored) for h in e.block_hashes
    }
    assert dumped == streamed
    assert set(prefix_hashes(PROMPT, BS)) <= dumped
    assert set(prefix_hashes(PROMPT, BS, cache_salt="s")) <= dumped
    assert [e.parent_hash for e in dump.events] == [None, None]  # two chains from the root


async def test_load_and_lifecycle_are_published(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    loads: list[WorkerLoad] = []
    phases: list[RequestPhase] = []

    async def on_load(msg: Msg) -> None:
        loads.append(codec.decode(msg.data, WorkerLoad))

    async def on_phase(msg: Msg) -> None:
        phases.append(codec.decode(msg.data, RequestPhase))

    load_sub = await nc.subscribe(subjects.load("w"), cb=on_load)
    phase_sub = await nc.subscribe(subjects.lifecycle("w"), cb=on_phase)
    await nc.flush()
    async with running_mocker(
        nats_url, subjects, model_info, worker_id="w", num_gpu_blocks_override=64
    ):
        await _dump(nc, subjects, "w")
        batches = await _generate(nc, subjects, "w", PROMPT)
        await eventually_async(
            lambda: len(phases) >= 2 and loads[-1].active == 0,
            message="no two phases and an idle load",
        )
    await load_sub.unsubscribe()
    await phase_sub.unsubscribe()
    request_id = batches[0].request_id
    assert [(p.request_id, p.phase, p.worker_id) for p in phases] == [
        (request_id, "prefill_done", "w"),
        (request_id, "finished", "w"),
    ]
    assert loads[0] == WorkerLoad(worker_id="w", kv_total_blocks=64, ts=loads[0].ts)
    assert all(load.kv_total_blocks == 64 for load in loads)
    assert (loads[-1].active, loads[-1].waiting, loads[-1].prefill_tokens) == (0, 0, 0)


async def test_a_rejected_request_is_answered_and_its_slot_freed(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    phase_sub = await nc.subscribe(subjects.lifecycle("w"))
    stream_to = subjects.stream("f1", "r-unknown")
    stream_sub = await nc.subscribe(stream_to)
    async with running_mocker(nats_url, subjects, model_info, worker_id="w") as mocker:
        await _dump(nc, subjects, "w")
        gen = Generate(
            request_id="r-unknown",
            model="no/such-model",
            token_ids=PROMPT,
            sampling=SamplingParams(max_tokens=4),
            stream_to=stream_to,
        )
        await nc.publish(subjects.generate("w"), codec.encode(gen))
        failed = codec.decode((await stream_sub.next_msg(timeout=5)).data, RequestFailed)
        phase = codec.decode((await phase_sub.next_msg(timeout=5)).data, RequestPhase)
        errors = mocker.metrics.service.registry.get_sample_value(
            "jetserve_errors_total", {"service": "mocker", "code": "model_not_found"}
        )
    assert (failed.request_id, failed.code, failed.status) == ("r-unknown", "model_not_found", 404)
    assert (phase.request_id, phase.phase) == ("r-unknown", "finished")
    assert errors == 1.0


async def test_restarted_worker_starts_again_with_all_blocks_cleared(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    for _ in range(2):
        async with running_mocker(nats_url, subjects, model_info, worker_id="w") as mocker:
            await _dump(nc, subjects, "w")
            await _generate(nc, subjects, "w", PROMPT)
            events = mocker.workers[0].publisher.events
            await eventually_async(
                lambda events=events: len(events) == 0,  # type: ignore[misc]
                message="KV events left unsent",
            )
    batches = await _stream_batches(nc, subjects)
    restarts = [i for i, b in enumerate(batches) if b.event_id == 1]
    assert len(restarts) == 2
    assert all(batches[i].events[0] == AllBlocksCleared() for i in restarts)


async def test_ensure_kv_stream_is_idempotent_and_updates_limits(
    subjects: Subjects, nc: Client
) -> None:
    js = nc.jetstream()
    await ensure_kv_stream(js, subjects, max_age_s=60, max_bytes=1 << 20)
    await ensure_kv_stream(js, subjects, max_age_s=60, max_bytes=1 << 20)
    info = await ensure_kv_stream(js, subjects, max_age_s=120, max_bytes=2 << 20)
    assert (info.config.max_age, info.config.max_bytes) == (120, 2 << 20)
    assert info.config.subjects == [subjects.kv_events_all]


def test_messages_round_trip() -> None:
    batch = KvEventBatch(worker_id="w", event_id=1, events=(AllBlocksCleared(),))
    assert msgspec.msgpack.decode(codec.encode(batch), type=KvEventBatch) == batch


async def test_an_undecodable_dump_request_is_logged_counted_and_not_answered(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with running_mocker(nats_url, subjects, model_info, worker_id="w") as mocker:
        await _dump(nc, subjects, "w")  # subscribed
        with capture_logs() as logs:
            with contextlib.suppress(TimeoutError):
                await nc.request(subjects.kv_dump("w"), b"\xc1 not msgpack", timeout=0.5)
            await eventually_async(
                lambda: any(e["event"] == "message_undecodable" for e in logs),
                message="message_undecodable never logged",
            )
        metrics = mocker.metrics.service
    (logged,) = [e for e in logs if e["event"] == "message_undecodable"]
    assert logged["kind"] == "kv_dump_request"
    assert metrics.errors.labels(metrics.service, "message_undecodable")._value.get() == 1
