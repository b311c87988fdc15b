"""Router + mocker in-process against a real nats-server: routing, streaming, errors, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.mocker.service import Mocker, ModelInfo
from services.router.config import RouterConfig
from services.router.service import Router
from shared import codec
from shared.bus import connect, no_responders
from shared.messages import (
    Cancel,
    Generate,
    RequestFailed,
    RouteDecision,
    SamplingParams,
    TokenBatch,
    WorkerEvent,
    WorkerLost,
)
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.subjects import Subjects
from tests.integration import mocker_support
from tests.support import eventually_async, eventually_awaited

MODEL = DEFAULT_MODEL_NAME
PROMPT = tuple(range(100, 140))
HANG_S = 30.0
"""Waits for what normally takes well under a second: only a hang runs into it."""


@asynccontextmanager
async def running_mocker(
    nats_url: str, subjects: Subjects, model: ModelInfo, **overrides: Any
) -> AsyncIterator[Mocker]:
    """The shared running mocker, once every worker answers its generate subject."""

    async def answered(mocker: Mocker) -> None:
        for worker in mocker.workers:
            await _until_answered(nats_url, subjects.generate(worker.worker_id), subjects)

    async with mocker_support.running_mocker(
        nats_url, subjects, model, ready=answered, **overrides
    ) as mocker:
        yield mocker


@asynccontextmanager
async def running_router(
    nats_url: str, subjects: Subjects, **overrides: Any
) -> AsyncIterator[Router]:
    nc = await connect(nats_url, name="test-router")
    router = Router(RouterConfig(nats_url=nats_url, namespace=subjects.namespace, **overrides), nc)
    await router.start()
    await _until_answered(nats_url, subjects.route, subjects)
    try:
        yield router
    finally:
        await router.stop()
        await nc.drain()


async def _until_answered(nats_url: str, subject: str, subjects: Subjects) -> None:
    """Wait until ``subject`` answers a probe from another connection.

    nats-server can report "no responders" to another client for a moment after a
    subscription's flush returned, so a test waits for an answer rather than trusting start().
    """
    nc = await connect(nats_url, name="test-probe")

    async def answered() -> bool:
        async with Stream(nc, subjects) as probe:
            gen = Generate(
                request_id=probe.request_id,
                model="probe-model-without-workers",
                token_ids=(1,),
                sampling=SamplingParams(max_tokens=1),
                stream_to=probe.subject,
            )
            await nc.publish(subject, codec.encode(gen), reply=probe.subject)
            return no_responders(await probe.raw()) is None

    try:
        await eventually_awaited(answered, interval_s=0.01, message=f"nobody answers on {subject}")
    finally:
        await nc.drain()


class Stream:
    """One request's stream subject, as a formatter would hold it."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self.request_id = uuid.uuid4().hex
        self.subject = subjects.stream("f1", self.request_id)
        self._nc = nc
        self._sub: Subscription | None = None

    async def __aenter__(self) -> Stream:
        self._sub = await self._nc.subscribe(self.subject)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._sub is not None
        await self._sub.unsubscribe()

    async def raw(self, timeout_s: float = 5.0) -> Msg:
        assert self._sub is not None
        return await self._sub.next_msg(timeout=timeout_s)

    async def next(self, timeout_s: float = 5.0) -> WorkerEvent:
        msg = await self.raw(timeout_s)
        assert no_responders(msg) is None, f"no responders on {no_responders(msg)}"
        return codec.WORKER_EVENTS.decode(msg.data)

    async def until_finished(self, timeout_s: float = 5.0) -> list[TokenBatch]:
        batches: list[TokenBatch] = []
        while not batches or batches[-1].finish_reason is None:
            event = await self.next(timeout_s)
            assert isinstance(event, TokenBatch), event
            batches.append(event)
        return batches


async def _generate(
    nc: Client, subjects: Subjects, stream: Stream, worker_id: str | None = None, **sampling: Any
) -> None:
    gen = Generate(
        request_id=stream.request_id,
        model=MODEL,
        token_ids=PROMPT,
        sampling=SamplingParams(**sampling),
        stream_to=stream.subject,
        worker_id=worker_id,
    )
    await nc.publish(subjects.route, codec.encode(gen), reply=stream.subject)


def _ids(batches: list[TokenBatch]) -> list[int]:
    return [t for b in batches for t in b.token_ids]


async def test_generate_streams_exactly_max_tokens_then_length(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w"),
        running_router(nats_url, subjects),
        Stream(nc, subjects) as stream,
    ):
        await _generate(nc, subjects, stream, max_tokens=64, ignore_eos=True)
        batches = await stream.until_finished()
    assert len(_ids(batches)) == 64
    assert batches[-1].finish_reason == "length"
    assert [b.index for b in batches] == [
        sum(len(x.token_ids) for x in batches[:i]) for i in range(len(batches))
    ]
    assert (batches[0].prompt_tokens, batches[0].cached_tokens, batches[0].worker_id) == (
        len(PROMPT),
        0,
        "w",
    )


async def test_speedup_zero_sends_few_messages_and_the_first_token_alone(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w"),
        running_router(nats_url, subjects),
        Stream(nc, subjects) as stream,
    ):
        await _generate(nc, subjects, stream, max_tokens=64, ignore_eos=True)
        batches = await stream.until_finished()
    assert len(batches[0].token_ids) == 1
    assert len(batches) <= 16


async def test_same_seed_same_tokens_and_eos_stop(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    eos = model_info.eos_token_ids[0]
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", seed=1),
        running_router(nats_url, subjects),
    ):
        runs = []
        for _ in range(2):
            async with Stream(nc, subjects) as stream:
                await _generate(nc, subjects, stream, max_tokens=5000, stop_token_ids=(eos,))
                runs.append(await stream.until_finished())
    assert _ids(runs[0]) == _ids(runs[1])
    assert (runs[0][-1].finish_reason, runs[0][-1].stop_token_id) == ("stop", eos)
    assert _ids(runs[0])[-1] == eos


async def test_round_robin_alternates_between_two_mockers(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", num_workers=2),
        running_router(nats_url, subjects, router_mode="round-robin"),
    ):
        served = []
        for _ in range(4):
            async with Stream(nc, subjects) as stream:
                await _generate(nc, subjects, stream, max_tokens=2)
                served.append((await stream.until_finished())[0].worker_id)
    assert served == ["w-0", "w-1", "w-0", "w-1"]


async def test_pinned_worker_gets_the_request(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", num_workers=2),
        running_router(nats_url, subjects),
        Stream(nc, subjects) as stream,
    ):
        await _generate(nc, subjects, stream, worker_id="w-1", max_tokens=2)
        batches = await stream.until_finished()
    assert batches[0].worker_id == "w-1"


async def test_no_worker_replies_request_failed_503(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    async with running_router(nats_url, subjects), Stream(nc, subjects) as stream:
        await _generate(nc, subjects, stream, max_tokens=2)
        event = await stream.next()
    assert isinstance(event, RequestFailed)
    assert (event.status, event.code, event.retry_after_s) == (503, "no_worker_available", 1.0)
    assert event.request_id == stream.request_id


async def test_cancel_stops_a_long_generation(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", speedup_ratio=1.0),
        running_router(nats_url, subjects),
        Stream(nc, subjects) as stream,
    ):
        await _generate(nc, subjects, stream, max_tokens=5000, ignore_eos=True)
        first = await stream.next()
        assert isinstance(first, TokenBatch)
        await nc.publish(subjects.cancel, codec.encode(Cancel(request_id=stream.request_id)))
        rest = await stream.until_finished(timeout_s=HANG_S)
    # Stopped by the cancel, long before its 5000 tokens (some 30 s at this speed) ran out.
    assert rest[-1].finish_reason == "cancelled"
    assert len(_ids([first, *rest])) < 5000


async def test_context_overflow_is_rejected_by_the_worker(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, replace(model_info, context_length=50), worker_id="w"),
        running_router(nats_url, subjects),
        Stream(nc, subjects) as stream,
    ):
        await _generate(nc, subjects, stream, max_tokens=20)
        event = await stream.next()
    assert isinstance(event, RequestFailed)
    assert (event.status, event.code) == (400, "context_length_exceeded")


async def test_many_concurrent_requests_all_finish(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", max_num_seqs=8),
        running_router(nats_url, subjects),
    ):
        streams = [Stream(nc, subjects) for _ in range(32)]
        for s in streams:
            await s.__aenter__()
        try:
            for s in streams:
                await _generate(nc, subjects, s, max_tokens=32, ignore_eos=True)
            results = await asyncio.gather(*(s.until_finished() for s in streams))
        finally:
            for s in streams:
                await s.__aexit__()
    assert all(len(_ids(r)) == 32 and r[-1].finish_reason == "length" for r in results)


async def test_generate_arriving_after_its_cancel_is_not_generated(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w"),
        running_router(nats_url, subjects),
        Stream(nc, subjects) as stream,
    ):
        await nc.publish(subjects.cancel, codec.encode(Cancel(request_id=stream.request_id)))
        await nc.flush()
        await _generate(nc, subjects, stream, max_tokens=3000, ignore_eos=True)
        batches = await stream.until_finished()
    assert (batches[-1].finish_reason, _ids(batches)) == ("cancelled", [])


@pytest.mark.parametrize("dynamo_step_timing", [True, False])
async def test_first_token_goes_out_before_the_decode_time_of_its_step(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo, dynamo_step_timing: bool
) -> None:
    """B is sent right after A's second token, while A's next step runs. Dynamo's order
    (prefill, emit, decode) sent that token at the start of the step, so B joins the next step
    and goes out with A's next token. At the end of the step instead, the running step ends
    with A's next token, and B goes out one step later, with A's token after that.

    Told apart by the order of the batches, not by a clock: the one timing this needs is that B
    reaches the worker within a decode time (about 0.29 s at this speed; the hops take
    milliseconds). The timing model itself is unit-tested (``test_pacing``, ``test_engine``)."""
    speedup = 0.02  # 50x slower: one decode step is much longer than B's way to the worker
    async with (
        running_mocker(
            nats_url,
            subjects,
            model_info,
            worker_id="w",
            speedup_ratio=speedup,
            dynamo_step_timing=dynamo_step_timing,
        ),
        running_router(nats_url, subjects),
        Stream(nc, subjects) as a,
        Stream(nc, subjects) as b,
    ):
        both = await nc.subscribe(subjects.stream_all("f1"))  # A's and B's batches, in order
        try:
            await _generate(nc, subjects, a, max_tokens=5, ignore_eos=True)
            for _ in range(2):
                assert (await _next_batch(both)).request_id == a.request_id
            await _generate(nc, subjects, b, max_tokens=1)
            a_tokens_before_b = 0
            while (first := await _next_batch(both)).request_id != b.request_id:
                a_tokens_before_b += 1
        finally:
            await both.unsubscribe()
        await a.until_finished()
    assert first.cached_tokens > 0
    if dynamo_step_timing:
        assert a_tokens_before_b == 1  # B's first token came with A's next one
    else:
        assert a_tokens_before_b >= 2  # A's next token went out first, at the end of its step


async def _next_batch(sub: Subscription, timeout_s: float = HANG_S) -> TokenBatch:
    msg = await sub.next_msg(timeout=timeout_s)
    event = codec.WORKER_EVENTS.decode(msg.data)
    assert isinstance(event, TokenBatch), event
    return event


@pytest.mark.parametrize("inflight_overlap", [True, False])
async def test_a_request_sharing_a_prefix_still_in_prefill_joins_it(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo, inflight_overlap: bool
) -> None:
    """B shares A's new 4-block prefix and arrives while A is still prefilling, before any KV
    event: the router counts the prefix A computes as B's overlap (unless switched off), and
    the engine reuses A's blocks once scheduled, so B prefills only its own tail."""
    prefix = tuple(range(1000, 1064))  # 4 blocks of 16
    async with (
        running_mocker(
            nats_url, subjects, model_info, worker_id="w", num_workers=2, speedup_ratio=0.05
        ),
        running_router(
            nats_url, subjects, router_mode="kv", inflight_overlap=inflight_overlap, seed=7
        ),
        Stream(nc, subjects) as a,
        Stream(nc, subjects) as b,
    ):
        for stream, tail in ((a, (1,)), (b, (2,))):
            gen = Generate(
                request_id=stream.request_id,
                model=MODEL,
                token_ids=(*prefix, *tail),
                sampling=SamplingParams(max_tokens=2, ignore_eos=True),
                stream_to=stream.subject,
            )
            await nc.publish(subjects.route, codec.encode(gen), reply=stream.subject)
        first_a, first_b = await a.next(), await b.next()
        await a.until_finished()
        await b.until_finished()
    assert isinstance(first_a, TokenBatch)
    assert isinstance(first_b, TokenBatch)
    if inflight_overlap:
        assert first_b.worker_id == first_a.worker_id
        assert (first_a.cached_tokens, first_b.cached_tokens) == (0, 64)
    else:  # both workers look alike but A's holds A's prefill: B recomputes the prefix
        assert first_b.worker_id != first_a.worker_id
        assert first_b.cached_tokens == 0


async def test_a_full_queue_answers_worker_busy(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(
            nats_url,
            subjects,
            model_info,
            worker_id="w",
            max_num_seqs=1,
            max_waiting=1,
            speedup_ratio=1.0,
        ),
        running_router(nats_url, subjects),
    ):
        streams = [Stream(nc, subjects) for _ in range(3)]
        for s in streams:
            await s.__aenter__()
        try:
            for s in streams:  # one runs, one waits, the third finds the queue full
                await _generate(nc, subjects, s, max_tokens=200, ignore_eos=True)
            third = await streams[2].next()
        finally:
            for s in streams:
                await s.__aexit__()
    assert isinstance(third, RequestFailed)
    assert (third.status, third.code, third.retry_after_s) == (503, "worker_busy", 1.0)


async def test_workers_answer_pings_and_a_stopped_one_is_no_responders(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with running_mocker(nats_url, subjects, model_info, worker_id="w"):
        answer = await nc.request(subjects.worker_ping("w"), b"", timeout=2)
    assert answer.data == b""
    with pytest.raises(nats.errors.NoRespondersError):
        await nc.request(subjects.worker_ping("w"), b"", timeout=2)


async def test_a_killed_worker_is_lost_and_its_requests_named(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    lost: asyncio.Queue[WorkerLost] = asyncio.Queue()

    async def on_lost(msg: Msg) -> None:
        lost.put_nowait(codec.decode(msg.data, WorkerLost))

    await nc.subscribe(subjects.worker_lost, cb=on_lost)
    env = {**os.environ, "JETSERVE_NATS_URL": nats_url, "JETSERVE_NAMESPACE": subjects.namespace}
    cmd = [sys.executable, "-m", "services.mocker", "--worker-id", "doomed"]
    cmd += ["--speedup-ratio", "1", "--model-path", str(model_info.model_dir)]
    worker = await asyncio.create_subprocess_exec(
        *cmd, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    try:

        async def pongs() -> bool:
            with contextlib.suppress(nats.errors.Error):
                await nc.request(subjects.worker_ping("doomed"), b"", timeout=1)
                return True
            return False

        await eventually_awaited(  # a new process: imports, model files, registration
            pongs, timeout_s=HANG_S, interval_s=0.1, message="the worker never answered a ping"
        )
        async with running_router(nats_url, subjects) as router, Stream(nc, subjects) as stream:
            await eventually_async(  # the router learns the card from its registry watch
                lambda: router.live(MODEL),
                timeout_s=HANG_S,
                interval_s=0.05,
                message="the router never saw the worker live",
            )
            await _generate(nc, subjects, stream, max_tokens=5000, ignore_eos=True)
            assert isinstance(await stream.next(), TokenBatch)
            worker.kill()
            notice = await asyncio.wait_for(lost.get(), timeout=HANG_S)
            assert router.core.load.requests("doomed") == 0
            assert router.live(MODEL) == []
    finally:
        if worker.returncode is None:
            worker.kill()
        await worker.wait()
    # Found by the router's probe ("no responders"), not left to the card's TTL or a timeout.
    assert (notice.worker_id, notice.request_ids, notice.reason) == (
        "doomed",
        (stream.request_id,),
        "no_responders",
    )


async def test_a_request_whose_end_is_never_heard_stops_weighing_after_a_load_report(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    # A peer's decision for a request that never reaches the worker (as when nats-server went
    # away with it): the worker's next load report, which leaves it out, ends it here.
    ghost = RouteDecision(
        request_id="ghost", router_id="peer", worker_id="w", model=MODEL, mode="kv"
    )
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w"),
        running_router(nats_url, subjects, load_settle_after_s=0.2) as router,
    ):
        await nc.publish(subjects.decisions, codec.encode(ghost))
        await eventually_async(lambda: "ghost" in router.core.load, message="no ghost counted")
        # Older than --load-settle-after-s by the worker's next load report (a heartbeat).
        await eventually_async(lambda: len(router.core.load) == 0, message="the ghost stayed")
        ended = router.metrics.base.registry.get_sample_value(
            "jetserve_router_unheard_ends_total", {"how": "load_report"}
        )
    assert ended == 1
