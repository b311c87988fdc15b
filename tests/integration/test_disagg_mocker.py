"""Disaggregated serving between two in-process mockers on a real nats-server, driven by
hand-made ``Generate`` messages (no router): a prefill worker answers ``PrefillResult`` on the
router's subject and pins the prompt's blocks; a decode worker pulls them, streams with the
prefill worker named, and releases them (``KvRelease``) so they become evictable there. Also:
data-parallel ranks on the wire, bad ranks, cancels, and liveness while a phase runs."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError

from services.mocker.service import Mocker, ModelInfo
from shared import codec
from shared.hashing import prefix_hashes
from shared.messages import (
    Cancel,
    Generate,
    KvDump,
    KvDumpRequest,
    KvRelease,
    KvTransfer,
    PrefillResult,
    RequestFailed,
    RequestPhase,
    SamplingParams,
    TokenBatch,
    WorkerPing,
    WorkerPong,
)
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.registry import WorkerDirectory
from shared.subjects import Subjects
from tests.integration.mocker_support import running_mocker
from tests.support import eventually_async, eventually_awaited

BS = 16
PROMPT = tuple(range(100, 140))  # 40 tokens: 2 full blocks
ROUTER = "r1"
BOUND_S = 10.0
"""Only a hang runs into this."""


async def _ready(nc: Client, subjects: Subjects, worker_id: str) -> None:
    """Until the worker answers a KV dump request (its subscription is visible)."""

    async def answers() -> bool:
        request = codec.encode(KvDumpRequest(router_id="test"))
        try:
            reply = await nc.request(subjects.kv_dump(worker_id), request, timeout=2)
        except NoRespondersError:
            return False
        codec.decode(reply.data, KvDump)
        return True

    await eventually_awaited(answers, timeout_s=BOUND_S, message=f"{worker_id} never answered")


def _generate(subjects: Subjects, request_id: str, **fields: Any) -> Generate:
    settings: dict[str, Any] = {
        "request_id": request_id,
        "model": DEFAULT_MODEL_NAME,
        "token_ids": PROMPT,
        "sampling": SamplingParams(max_tokens=8, ignore_eos=True),
        "stream_to": subjects.stream("f1", request_id),
        **fields,
    }
    return Generate(**settings)


async def _next(sub: Subscription, kind: type[Any]) -> Any:
    msg = await sub.next_msg(timeout=BOUND_S)
    return codec.decode(msg.data, kind)


async def _stream(sub: Subscription) -> list[TokenBatch]:
    batches: list[TokenBatch] = []
    while not batches or batches[-1].finish_reason is None:
        batches.append(await _next(sub, TokenBatch))
    return batches


@asynccontextmanager
async def _pair(
    nats_url: str, subjects: Subjects, nc: Client, model: ModelInfo, **overrides: Any
) -> AsyncIterator[tuple[Mocker, Mocker]]:
    """A prefill worker ``pw`` and a decode worker ``dw``, both ready."""
    async with AsyncExitStack() as stack:
        prefill = await stack.enter_async_context(
            running_mocker(nats_url, subjects, model, worker_id="pw", role="prefill", **overrides)
        )
        decode = await stack.enter_async_context(
            running_mocker(nats_url, subjects, model, worker_id="dw", role="decode", **overrides)
        )
        await _ready(nc, subjects, "pw")
        await _ready(nc, subjects, "dw")
        yield prefill, decode


async def test_prefill_then_decode_then_release(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    rid = uuid.uuid4().hex
    prefill_to = subjects.prefill_result(ROUTER)
    answers = await nc.subscribe(prefill_to)
    stream = await nc.subscribe(subjects.stream("f1", rid))
    releases = await nc.subscribe(subjects.kv_release("pw"))
    async with _pair(nats_url, subjects, nc, model_info) as (prefill, decode):
        directory = WorkerDirectory(nc.jetstream(), subjects, ttl_s=10.0)
        await directory.start()
        try:
            await eventually_async(
                lambda: len(directory.live(DEFAULT_MODEL_NAME)) == 2,
                timeout_s=BOUND_S,
                message="the two workers' cards never showed",
            )
            cards = {c.worker_id: c for c in directory.live(DEFAULT_MODEL_NAME)}
        finally:
            await directory.stop()
        assert (cards["pw"].role, cards["dw"].role, cards["pw"].dp_size) == ("prefill", "decode", 1)

        gen = _generate(subjects, rid, prefill_to=prefill_to)
        await nc.publish(subjects.generate("pw"), codec.encode(gen))
        result = await _next(answers, PrefillResult)
        assert (result.request_id, result.worker_id, result.prompt_tokens) == (rid, "pw", 40)
        assert len(result.token_ids) == 1
        handle = result.kv_transfer
        assert handle.source_worker_id == "pw"
        assert handle.expires_at > time.time()
        assert handle.params["block_hashes"] == prefix_hashes(PROMPT, BS)
        assert handle.params["num_blocks"] == 2
        assert handle.params["block_bytes"] == 114_688 * BS  # Qwen3-0.6B's config.json
        with pytest.raises(TimeoutError):
            await stream.next_msg(timeout=0.2)  # a prefill phase streams nothing
        prefill_engine = prefill.workers[0].engine
        assert prefill_engine.load().kv_used_blocks == 2  # pinned

        follow = _generate(subjects, rid, kv_transfer=handle)
        await nc.publish(subjects.generate("dw"), codec.encode(follow))
        batches = await _stream(stream)
        assert sum(len(b.token_ids) for b in batches) == 8
        assert {(b.worker_id, b.prefill_worker_id, b.dp_rank) for b in batches} == {("dw", "pw", 0)}
        # both prompt blocks were pulled, not computed; usage reports the prefill worker's
        # prefix-cache hits (the handle's, none here), not the pulled blocks
        assert batches[0].cached_tokens == handle.cached_tokens == 0
        release = await _next(releases, KvRelease)
        assert (release.request_id, release.pulled_blocks) == (rid, 2)
        await eventually_async(  # evictable again
            lambda: prefill_engine.load().kv_used_blocks == 0,
            timeout_s=BOUND_S,
            message="the prefill worker still pins the pulled blocks",
        )
        decode_cache = decode.workers[0].engine.engine.cache  # type: ignore[attr-defined]
        assert all(h in decode_cache for h in prefix_hashes(PROMPT, BS))
        with pytest.raises(TimeoutError):
            await releases.next_msg(timeout=0.2)  # exactly once


async def test_a_decode_worker_that_holds_the_blocks_pulls_none(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    prefill_to = subjects.prefill_result(ROUTER)
    answers = await nc.subscribe(prefill_to)
    releases = await nc.subscribe(subjects.kv_release("pw"))
    async with _pair(nats_url, subjects, nc, model_info):
        warm = _generate(subjects, "warm")
        warm_stream = await nc.subscribe(warm.stream_to)
        await nc.publish(subjects.generate("dw"), codec.encode(warm))
        await _stream(warm_stream)
        await nc.publish(
            subjects.generate("pw"), codec.encode(_generate(subjects, "r", prefill_to=prefill_to))
        )
        result = await _next(answers, PrefillResult)
        follow = _generate(subjects, "r", kv_transfer=result.kv_transfer)
        stream = await nc.subscribe(follow.stream_to)
        await nc.publish(subjects.generate("dw"), codec.encode(follow))
        await _stream(stream)
        release = await _next(releases, KvRelease)
    assert release.pulled_blocks == 0


async def test_bad_ranks_get_a_400_on_the_right_subject(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    prefill_to = subjects.prefill_result(ROUTER)
    answers = await nc.subscribe(prefill_to)
    async with _pair(nats_url, subjects, nc, model_info):
        gen = _generate(subjects, "bad", dp_rank=1)
        stream = await nc.subscribe(gen.stream_to)
        await nc.publish(subjects.generate("dw"), codec.encode(gen))
        failed = await _next(stream, RequestFailed)
        assert (failed.status, failed.param, failed.code) == (400, "dp_rank", "invalid_request")
        bad_prefill = _generate(subjects, "bad-p", dp_rank=5, prefill_to=prefill_to)
        await nc.publish(subjects.generate("pw"), codec.encode(bad_prefill))
        failed = await _next(answers, RequestFailed)
        assert (failed.request_id, failed.status, failed.param) == ("bad-p", 400, "dp_rank")


async def test_a_cancel_unpins_a_prefill(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    prefill_to = subjects.prefill_result(ROUTER)
    answers = await nc.subscribe(prefill_to)
    async with _pair(nats_url, subjects, nc, model_info) as (prefill, _):
        await nc.publish(
            subjects.generate("pw"), codec.encode(_generate(subjects, "c", prefill_to=prefill_to))
        )
        await _next(answers, PrefillResult)
        engine = prefill.workers[0].engine
        assert engine.load().kv_used_blocks == 2
        await nc.publish(subjects.cancel, codec.encode(Cancel(request_id="c")))
        await eventually_async(
            lambda: engine.load().kv_used_blocks == 0,
            timeout_s=BOUND_S,
            message="the cancelled prefill's blocks are still pinned",
        )


async def test_phases_are_held_while_they_run_and_a_cancelled_pull_releases(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    prefill_to = subjects.prefill_result(ROUTER)
    answers = await nc.subscribe(prefill_to)
    releases = await nc.subscribe(subjects.kv_release("pw"))

    async def held(worker_id: str, request_id: str) -> bool:
        ping = codec.encode(WorkerPing(request_id=request_id))
        reply = await nc.request(subjects.worker_ping(worker_id), ping, timeout=BOUND_S)
        pong: WorkerPong = codec.decode(reply.data, WorkerPong)
        return pong.held

    async with _pair(
        nats_url,
        subjects,
        nc,
        model_info,
        speedup_ratio=0.001,
        kv_transfer_latency_ms=60_000.0,
        max_num_batched_tokens=16,
    ):
        # Chunks of 16 tokens: the 40-token prefill takes 3 steps of ~17 simulated ms, ~17 s
        # each at speedup 0.001, and is in the engine until the last one: held while it runs.
        slow = _generate(subjects, "slow", prefill_to=prefill_to)
        await nc.publish(subjects.generate("pw"), codec.encode(slow))
        await eventually_awaited(
            lambda: held("pw", "slow"), timeout_s=BOUND_S, message="the prefill is never held"
        )
        assert not await held("pw", "other")
        await nc.publish(subjects.cancel, codec.encode(Cancel(request_id="slow")))
        failed = await _next(answers, RequestFailed)
        assert (failed.request_id, failed.code) == ("slow", "cancelled")

        # A decode whose pull takes 60 000 s: held while it pulls; cancelled, it releases.
        params = {"engine": "mocker", "block_hashes": prefix_hashes(PROMPT, BS), "num_blocks": 2}
        handle = KvTransfer(source_worker_id="pw", params=params)
        follow = _generate(subjects, "pulling", kv_transfer=handle)
        stream = await nc.subscribe(follow.stream_to)
        await nc.publish(subjects.generate("dw"), codec.encode(follow))
        await eventually_awaited(
            lambda: held("dw", "pulling"), timeout_s=BOUND_S, message="the pull is never held"
        )
        await nc.publish(subjects.cancel, codec.encode(Cancel(request_id="pulling")))
        (ended,) = await _stream(stream)
        assert (ended.finish_reason, ended.token_ids, ended.prefill_worker_id) == (
            "cancelled",
            (),
            "pw",
        )
        release = await _next(releases, KvRelease)
        assert (release.request_id, release.pulled_blocks) == ("pulling", 0)


async def test_data_parallel_ranks_on_the_wire(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    phases = await nc.subscribe(subjects.lifecycle("w"))
    async with running_mocker(
        nats_url, subjects, model_info, worker_id="w", data_parallel_size=2
    ) as mocker:
        await _ready(nc, subjects, "w")
        gen = _generate(subjects, "r", dp_rank=1)
        stream = await nc.subscribe(gen.stream_to)
        await nc.publish(subjects.generate("w"), codec.encode(gen))
        batches = await _stream(stream)
        assert {b.dp_rank for b in batches} == {1}
        seen = [await _next(phases, RequestPhase) for _ in range(2)]
        assert [(p.phase, p.dp_rank) for p in seen] == [("prefill_done", 1), ("finished", 1)]
        dump = codec.decode(
            (
                await nc.request(
                    subjects.kv_dump("w"), codec.encode(KvDumpRequest(router_id="t")), timeout=5
                )
            ).data,
            KvDump,
        )
        assert {e.dp_rank for e in dump.events} == {1}
        assert mocker.workers[0].engine.load().kv_total_blocks == 2 * 16384


async def test_a_cancel_during_a_prefills_last_step_answers_at_once_and_unpins(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    prefill_to = subjects.prefill_result(ROUTER)
    answers = await nc.subscribe(prefill_to)
    async with _pair(nats_url, subjects, nc, model_info, speedup_ratio=0.001) as (prefill, _):
        # One step of ~17 simulated ms, ~17 s at speedup 0.001: the engine has finished (and
        # pinned) the prefill at the step's start; its emission waits for the step's end.
        gen = _generate(subjects, "last", prefill_to=prefill_to)
        await nc.publish(subjects.generate("pw"), codec.encode(gen))
        engine = prefill.workers[0].engine
        await eventually_async(
            lambda: engine.load().kv_used_blocks == 2,
            timeout_s=BOUND_S,
            message="the prefill never pinned its two blocks",
        )
        await nc.publish(subjects.cancel, codec.encode(Cancel(request_id="last")))
        failed = await _next(answers, RequestFailed)
        assert (failed.request_id, failed.code, failed.status) == ("last", "cancelled", 499)
        assert engine.load().kv_used_blocks == 0
