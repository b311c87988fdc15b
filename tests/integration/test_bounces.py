""" "No responders" reaches the formatter: a missing router or worker is a 503 or a retry."""

from __future__ import annotations

import time

from nats.aio.client import Client

from services.mocker.service import ModelInfo
from shared import codec
from shared.messages import Generate, RequestFailed, SamplingParams, WorkerCard
from shared.registry import WorkerRegistration
from shared.subjects import Subjects
from tests.integration.test_router_mocker import (
    MODEL,
    PROMPT,
    Stream,
    running_mocker,
    running_router,
)


def _generate(stream: Stream, max_tokens: int = 4) -> Generate:
    return Generate(
        request_id=stream.request_id,
        model=MODEL,
        token_ids=PROMPT,
        sampling=SamplingParams(max_tokens=max_tokens),
        stream_to=stream.subject,
    )


async def _ghost(nc: Client, subjects: Subjects) -> WorkerRegistration:
    """A worker card in the registry with nobody behind it (a worker that just died)."""
    card = WorkerCard(worker_id="ghost", model=MODEL, started_at=time.time())
    reg = WorkerRegistration(nc.jetstream(), subjects, card, ttl_s=30)
    await reg.start()
    return reg


async def test_router_retries_another_worker_when_the_chosen_one_is_gone(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    ghost = await _ghost(nc, subjects)
    try:
        async with (
            running_mocker(nats_url, subjects, model_info),
            running_router(nats_url, subjects),
        ):
            for _ in range(4):  # round-robin hits the ghost at least once
                async with Stream(nc, subjects) as stream:
                    await nc.publish(subjects.route, codec.encode(_generate(stream)))
                    batches = await stream.until_finished()
                assert batches[-1].finish_reason == "length"
    finally:
        await ghost.stop()


async def test_only_unreachable_workers_give_503_to_the_formatter(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    ghost = await _ghost(nc, subjects)
    try:
        async with running_router(nats_url, subjects), Stream(nc, subjects) as stream:
            await nc.publish(subjects.route, codec.encode(_generate(stream)))
            event = await stream.next()
        assert isinstance(event, RequestFailed)
        assert event.status == 503
    finally:
        await ghost.stop()
