"""A router with a prefill and a decode mocker on a real nats-server (issue 24): the router
sends the prefill phase, waits for ``PrefillResult``, sends the decode phase; the stream names
both workers; a prefill worker gone since its heartbeat is bounced off and the prefill is done
by another one; a query-only request reaches no worker."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client

from services.mocker.service import Mocker, ModelInfo
from shared import codec
from shared.messages import (
    Cancel,
    Generate,
    RouteChoice,
    RouteDecision,
    RoutingHints,
    SamplingParams,
    TokenBatch,
)
from shared.subjects import Subjects
from tests.integration.test_router_mocker import (
    MODEL,
    Stream,
    running_mocker,
    running_router,
)
from tests.support import eventually_async

PROMPT = tuple(range(300, 300 + 16 * 12))  # 12 full blocks
HANG_S = 30.0


async def _send(
    nc: Client, subjects: Subjects, stream: Stream, routing: RoutingHints | None = None
) -> None:
    gen = Generate(
        request_id=stream.request_id,
        model=MODEL,
        token_ids=PROMPT,
        sampling=SamplingParams(max_tokens=16, ignore_eos=True),
        stream_to=stream.subject,
        routing=routing,
    )
    await nc.publish(subjects.route, codec.encode(gen), reply=stream.subject)


class Decisions:
    def __init__(self) -> None:
        self.seen: list[RouteDecision] = []

    async def on(self, msg: Any) -> None:
        self.seen.append(codec.decode(msg.data, RouteDecision))


async def test_both_phases_run_and_the_stream_names_both_workers(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    decisions = Decisions()
    await nc.subscribe(subjects.decisions, cb=decisions.on)
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="pw", role="prefill"),
        running_mocker(nats_url, subjects, model_info, worker_id="dw", role="decode"),
        running_router(nats_url, subjects, router_mode="kv"),
        Stream(nc, subjects) as stream,
    ):
        await _send(nc, subjects, stream)
        batches = await stream.until_finished(HANG_S)
    assert sum(len(b.token_ids) for b in batches) == 16
    first = batches[0]
    assert (first.worker_id, first.prefill_worker_id) == ("dw", "pw")
    # usage counts prefix-cache hits of the prefill worker (none: a new prompt), not the
    # blocks the decode worker pulled
    assert first.cached_tokens == 0
    decision = decisions.seen[0]
    assert (decision.disagg, decision.prefill_worker_id, decision.worker_id) == (
        "remote",
        "pw",
        "dw",
    )


async def test_a_prefill_worker_gone_since_its_heartbeat_is_replaced(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    decisions = Decisions()
    await nc.subscribe(subjects.decisions, cb=decisions.on)
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="pw1", role="prefill") as pw1,
        running_mocker(nats_url, subjects, model_info, worker_id="pw2", role="prefill"),
        running_mocker(nats_url, subjects, model_info, worker_id="dw", role="decode"),
        running_router(nats_url, subjects, router_mode="kv"),
    ):
        async with Stream(nc, subjects) as warm:  # the prompt is cached on pw1 now
            await _send(nc, subjects, warm, RoutingHints(prefill_worker_id="pw1"))
            await warm.until_finished(HANG_S)
        await _vanish(pw1)  # its card stays live until its TTL: the router still picks it
        async with Stream(nc, subjects) as stream:
            await _send(nc, subjects, stream)
            batches = await stream.until_finished(HANG_S)
    assert batches[0].prefill_worker_id == "pw2"
    assert sum(len(b.token_ids) for b in batches) == 16
    tried = [d.prefill_worker_id for d in decisions.seen if d.request_id == stream.request_id]
    assert tried == ["pw1", "pw2"]


async def _vanish(mocker: Mocker) -> None:
    """Unsubscribe the mocker's workers from the bus without deregistering (a process whose
    card outlives it)."""
    for worker in mocker.workers:
        for sub in worker._presence.subs:
            await sub.unsubscribe()
    await asyncio.sleep(0.1)


async def test_query_only_answers_and_reaches_no_worker(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    reached: list[str] = []

    async def on_generate(msg: Any) -> None:
        reached.append(codec.decode(msg.data, Generate).request_id)

    await nc.subscribe(subjects.generate("*"), cb=on_generate)
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="pw", role="prefill"),
        running_mocker(nats_url, subjects, model_info, worker_id="dw", role="decode"),
        running_router(nats_url, subjects, router_mode="kv"),
        Stream(nc, subjects) as stream,
    ):
        await _send(nc, subjects, stream, RoutingHints(query_only=True))
        answer = await stream.next(HANG_S)
        async with Stream(nc, subjects) as real:  # a real request after it does reach one
            await _send(nc, subjects, real)
            assert isinstance((await real.next(HANG_S)), TokenBatch)
    assert isinstance(answer, RouteChoice)
    assert (answer.worker_id, answer.prefill_worker_id) == ("dw", "pw")
    assert answer.token_ids == PROMPT
    assert stream.request_id not in reached
    assert real.request_id in reached


async def test_a_client_gone_during_the_prefill_cancels_both_phases(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    """The broadcast ``Cancel`` ends the router's wait (no decode phase is ever sent) and the
    prefill worker's work; its blocks are not left pinned and the router's load is freed."""
    reached: list[str] = []

    async def on_decode(msg: Any) -> None:
        reached.append(codec.decode(msg.data, Generate).request_id)

    await nc.subscribe(subjects.generate("dw"), cb=on_decode)
    slow = {"speedup_ratio": 0.01}  # the prefill's one step: ~1 s of wall time
    pw_id = {"worker_id": "pw", "role": "prefill"}
    async with (
        running_mocker(nats_url, subjects, model_info, **pw_id, **slow) as pw,
        running_mocker(nats_url, subjects, model_info, worker_id="dw", role="decode"),
        running_router(nats_url, subjects, router_mode="kv") as router,
        Stream(nc, subjects) as stream,
    ):
        engine = pw.workers[0].engine
        load = router.core.load
        await _send(nc, subjects, stream)
        await eventually_async(  # the prefill phase is on the prefill worker, its blocks pinned
            lambda: load.prefill_worker_of(stream.request_id) and engine.load().kv_used_blocks,
            message="the prefill phase never ran on the prefill worker",
        )
        assert load.prefill_worker_of(stream.request_id) == "pw"
        cancel = Cancel(request_id=stream.request_id)
        await nc.publish(subjects.cancel, codec.encode(cancel))
        await eventually_async(
            lambda: engine.load().kv_used_blocks == 0 and stream.request_id not in load,
            message="the cancelled prefill still holds blocks or load",
        )
        await asyncio.sleep(1.5)  # past the prefill's step: a decode phase would be sent now
        assert engine.load().kv_used_blocks == 0
        assert stream.request_id not in load
    assert stream.request_id not in reached


async def test_no_prefill_worker_serves_aggregated_and_counts_it(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="dw", role="decode"),
        running_router(nats_url, subjects, router_mode="kv") as router,
        Stream(nc, subjects) as stream,
    ):
        await _send(nc, subjects, stream)
        batches = await stream.until_finished(HANG_S)
        fallback = router.metrics.disagg.labels("fallback")._value.get()
    assert (batches[0].worker_id, batches[0].prefill_worker_id) == ("dw", "")
    assert fallback == 1


async def test_data_parallel_ranks_are_targets_and_a_rank_pin_is_honoured(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    ranks: set[int] = set()
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", data_parallel_size=2),
        running_router(nats_url, subjects, router_mode="round-robin"),
    ):
        for _ in range(4):
            async with Stream(nc, subjects) as stream:
                await _send(nc, subjects, stream)
                ranks |= {b.dp_rank for b in await stream.until_finished(HANG_S)}
        async with Stream(nc, subjects) as pinned:
            gen = Generate(
                request_id=pinned.request_id,
                model=MODEL,
                token_ids=PROMPT,
                sampling=SamplingParams(max_tokens=4, ignore_eos=True),
                stream_to=pinned.subject,
                worker_id="w",
                routing=RoutingHints(dp_rank=1),
            )
            await nc.publish(subjects.route, codec.encode(gen), reply=pinned.subject)
            pinned_ranks = {b.dp_rank for b in await pinned.until_finished(HANG_S)}
    assert ranks == {0, 1}
    assert pinned_ranks == {1}
