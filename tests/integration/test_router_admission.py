"""The router queue and token budgets against a real nats-server and mocker (issue 26).

Workers are made busy with Dynamo's thresholds: ``--active-prefill-tokens-threshold 0`` marks a
worker busy while any request routed there is in prefill, and a slow mocker (speedup 0.05)
keeps a long prompt in prefill for a while. Budgets come from an ``--admission-config`` file.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from services.mocker.service import ModelInfo
from shared import codec
from shared.messages import (
    Cancel,
    Generate,
    RequestFailed,
    RouteDecision,
    RoutingHints,
    SamplingParams,
    TokenBatch,
)
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.subjects import Subjects
from tests.integration.test_router_mocker import Stream, running_mocker, running_router
from tests.support import eventually_async

MODEL = DEFAULT_MODEL_NAME
LONG_PROMPT = tuple(range(1000, 1000 + 4000))
SHORT_PROMPT = tuple(range(100, 140))
BUSY_WHILE_PREFILLING = {"active_prefill_tokens_threshold": 0}
SLOW = {"speedup_ratio": 0.05, "max_num_seqs": 4}


async def _send(
    nc: Client,
    subjects: Subjects,
    stream: Stream,
    tokens: tuple[int, ...],
    *,
    max_tokens: int = 2,
    **hints: Any,
) -> None:
    gen = Generate(
        request_id=stream.request_id,
        model=MODEL,
        token_ids=tokens,
        sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        stream_to=stream.subject,
        routing=RoutingHints(**hints) if hints else None,
    )
    await nc.publish(subjects.route, codec.encode(gen), reply=stream.subject)


async def _outcome(stream: Stream, timeout_s: float = 20.0) -> TokenBatch | RequestFailed:
    """The last event of a request: its final batch or its failure."""
    while True:
        event = await stream.next(timeout_s)
        if isinstance(event, RequestFailed):
            return event
        assert isinstance(event, TokenBatch), event
        if event.finish_reason is not None:
            return event


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "admission.yaml"
    path.write_text(text)
    return path


async def test_requests_wait_while_every_worker_is_busy_then_all_finish(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    decisions: list[RouteDecision] = []

    async def seen(msg: Any) -> None:
        decisions.append(codec.decode(msg.data, RouteDecision))

    await nc.subscribe(subjects.decisions, cb=seen)
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", **SLOW),
        running_router(nats_url, subjects, **BUSY_WHILE_PREFILLING) as router,
    ):
        streams = [Stream(nc, subjects) for _ in range(3)]
        for s in streams:
            await s.__aenter__()
        try:
            for s in streams:
                await _send(nc, subjects, s, LONG_PROMPT)
            outcomes = [await _outcome(s, 60) for s in streams]
        finally:
            for s in streams:
                await s.__aexit__()
        routed = router.metrics.base.registry.get_sample_value(
            "jetserve_router_queue_requests_total", {"outcome": "routed"}
        )
    assert all(isinstance(o, TokenBatch) for o in outcomes), outcomes
    assert sorted(d.queued_ms > 0 for d in decisions) == [False, True, True]
    assert routed == 2


async def test_a_full_queue_is_a_529_with_retry_after(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", **SLOW),
        running_router(nats_url, subjects, queue_max_length=1, **BUSY_WHILE_PREFILLING),
    ):
        streams = [Stream(nc, subjects) for _ in range(3)]
        for s in streams:
            await s.__aenter__()
        try:
            for s in streams:  # one runs, one waits, the third finds the queue full
                await _send(nc, subjects, s, LONG_PROMPT)
            third = await streams[2].next()
            first_two = [await _outcome(s, 60) for s in streams[:2]]
        finally:
            for s in streams:
                await s.__aexit__()
    assert isinstance(third, RequestFailed)
    assert (third.status, third.code, third.retry_after_s) == (529, "queue_full", 1.0)
    assert all(isinstance(o, TokenBatch) for o in first_two)


async def test_a_request_waiting_too_long_is_a_529_and_a_cancelled_one_leaves(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", speedup_ratio=0.01),
        running_router(nats_url, subjects, queue_max_wait_s=0.5, **BUSY_WHILE_PREFILLING) as router,
        Stream(nc, subjects) as running,
        Stream(nc, subjects) as expiring,
        Stream(nc, subjects) as cancelled,
    ):
        await _send(nc, subjects, running, LONG_PROMPT, max_tokens=1)
        await _send(nc, subjects, cancelled, SHORT_PROMPT)
        await _send(nc, subjects, expiring, SHORT_PROMPT)
        await eventually_async(
            lambda: sum(len(q) for q in router.admission.queues.values()) == 2,
            message="two requests did not queue",
        )
        await nc.publish(subjects.cancel, codec.encode(Cancel(request_id=cancelled.request_id)))
        await eventually_async(
            lambda: cancelled.request_id not in router.admission.queues[MODEL],
            message="the cancelled request stayed queued",
        )
        expired = await expiring.next(10)
    assert isinstance(expired, RequestFailed)
    assert (expired.status, expired.code) == (529, "queue_full")
    assert "waited" in expired.message


async def test_a_tenant_over_its_budget_gets_429_others_do_not_and_a_new_router_agrees(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo, tmp_path: Path
) -> None:
    # 40 prompt + 64 output tokens = 104: the second request of tenant "small" is over.
    config = _policy(
        tmp_path,
        "tenants:\n  small: {tokens_per_minute: 100}\n  big: {tokens_per_minute: 100000}\n",
    )
    async with running_mocker(nats_url, subjects, model_info, worker_id="w"):
        async with running_router(nats_url, subjects, admission_config=config) as first:
            for tenant in ("small", "big"):
                async with Stream(nc, subjects) as s:
                    await _send(nc, subjects, s, SHORT_PROMPT, max_tokens=64, tenant=tenant)
                    assert isinstance(await _outcome(s), TokenBatch)
            await eventually_async(
                lambda: first.admission.ledger.spent.total("small", time.time()) >= 104,
                message="the output tokens were not charged",
            )
            async with Stream(nc, subjects) as s:
                await _send(nc, subjects, s, SHORT_PROMPT, tenant="small")
                refused = await _outcome(s)
            async with Stream(nc, subjects) as s:
                await _send(nc, subjects, s, SHORT_PROMPT, tenant="big")
                served = await _outcome(s)
            await asyncio.sleep(0.5)  # its ledger record is stored (every 0.2 s)
        # A router started now (a restart, or one more replica) replays the stored ledger.
        async with running_router(nats_url, subjects, admission_config=config) as second:
            assert second.router_id != first.router_id
            async with Stream(nc, subjects) as s:
                await _send(nc, subjects, s, SHORT_PROMPT, tenant="small")
                refused_again = await _outcome(s)
    assert isinstance(refused, RequestFailed)
    assert (refused.status, refused.code) == (429, "rate_limit_exceeded")
    assert refused.retry_after_s is not None
    assert 1 <= refused.retry_after_s <= 61
    assert isinstance(served, TokenBatch)
    assert isinstance(refused_again, RequestFailed)
    assert refused_again.code == "rate_limit_exceeded"
