"""Engine health checks (decision 029) on a real nats-server: an in-process mocker told to hang
(``--hang-after-tokens``) is found by its canary or its watchdog, leaves the registry, stops
answering probes (a router then publishes ``WorkerLost`` naming its requests), refuses new work
with a retryable error, and comes back when its engine finishes a canary again. A healthy
worker's canaries are invisible on the bus."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import nats.errors
import pytest
import structlog
from nats.aio.client import Client
from structlog.testing import capture_logs

from services.mocker.service import Mocker, ModelInfo
from shared import codec
from shared.messages import (
    Cancel,
    Generate,
    RequestFailed,
    SamplingParams,
    TokenBatch,
    WorkerLoad,
    WorkerLost,
)
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.subjects import Subjects
from tests.integration.mocker_support import running_mocker
from tests.integration.test_router_mocker import Stream, running_router
from tests.support import eventually_async, eventually_awaited, registered_cards

MODEL = DEFAULT_MODEL_NAME
PROMPT = tuple(range(300, 340))
QUICK = {"health_check_idle_s": 0.2, "health_check_timeout_s": 0.5, "engine_stall_s": 0.5}
"""Short checks, so a test sees a verdict within seconds (the waits below allow far more)."""
WAIT_S = 20.0


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as captured:
        yield captured


def _events(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == event]


def _sample(mocker: Mocker, name: str, **labels: str) -> float | None:
    return mocker.metrics.service.registry.get_sample_value(name, labels)


async def _card_ids(nc: Client, subjects: Subjects) -> set[str]:
    return {card.worker_id for card in await registered_cards(nc.jetstream(), subjects.namespace)}


async def _answers_ping(nc: Client, subjects: Subjects, worker_id: str) -> bool:
    try:
        await nc.request(subjects.worker_ping(worker_id), b"", timeout=1.0)
    except nats.errors.NoRespondersError:
        return False
    return True


def _generate(stream: Stream, **sampling: Any) -> Generate:
    return Generate(
        request_id=stream.request_id,
        model=MODEL,
        token_ids=PROMPT,
        sampling=SamplingParams(ignore_eos=True, **sampling),
        stream_to=stream.subject,
    )


async def test_an_idle_engine_that_hangs_is_found_by_its_canary(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo, logs: list[Any]
) -> None:
    async with running_mocker(
        nats_url, subjects, model_info, worker_id="h", hang_after_tokens=0, **QUICK
    ) as mocker:
        assert await _card_ids(nc, subjects) == {"h"}  # registered, then it hangs on its canary

        async def gone() -> bool:
            return not await _card_ids(nc, subjects)

        await eventually_awaited(gone, timeout_s=WAIT_S, message="the hung worker's card stays")
        assert not await _answers_ping(nc, subjects, "h")
        assert _sample(mocker, "jetserve_mocker_engine_healthy", worker_id="h") == 0
        assert (
            _sample(
                mocker,
                "jetserve_mocker_engine_unhealthy_total",
                worker_id="h",
                reason="canary_timeout",
            )
            == 1
        )
    [line] = _events(logs, "engine_unhealthy")
    assert (line["worker_id"], line["reason"], line["log_level"]) == (
        "h",
        "canary_timeout",
        "error",
    )


async def test_an_unhealthy_worker_refuses_new_work_with_a_retryable_error(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    async with running_mocker(
        nats_url, subjects, model_info, worker_id="h", hang_after_tokens=0, **QUICK
    ) as mocker:
        (worker,) = mocker.workers
        await eventually_async(
            lambda: not worker._watch.healthy, timeout_s=WAIT_S, message="never unhealthy"
        )
        async with Stream(nc, subjects) as stream:
            await nc.publish(subjects.generate("h"), codec.encode(_generate(stream, max_tokens=4)))
            failure = await stream.next(timeout_s=WAIT_S)
    assert isinstance(failure, RequestFailed)
    assert failure.code == "shutting_down"  # the formatter migrates it as a new request


async def test_a_stalled_busy_engine_is_found_and_its_requests_reported_lost(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo, logs: list[Any]
) -> None:
    lost = await nc.subscribe(subjects.worker_lost)
    async with (
        running_mocker(
            nats_url,
            subjects,
            model_info,
            worker_id="h",
            hang_after_tokens=10,
            **{**QUICK, "health_check_idle_s": 0.0},  # the watchdog alone
        ),
        running_router(nats_url, subjects),
        Stream(nc, subjects) as stream,
    ):
        gen = _generate(stream, max_tokens=100)
        await nc.publish(subjects.route, codec.encode(gen), reply=stream.subject)
        first = await stream.next(timeout_s=WAIT_S)
        assert isinstance(first, TokenBatch)
        assert first.token_ids  # it started, then hangs
        notice = codec.decode((await lost.next_msg(timeout=WAIT_S)).data, WorkerLost)
        # the formatter's part (017): cancel the old attempt on that worker, even while hung
        cancel = Cancel(request_id=gen.request_id, worker_id="h", reason="migrated")
        await nc.publish(subjects.cancel, codec.encode(cancel))
        event = await stream.next(timeout_s=WAIT_S)
        while isinstance(event, TokenBatch) and event.finish_reason is None:
            event = await stream.next(timeout_s=WAIT_S)
    assert (notice.worker_id, notice.request_ids, notice.reason) == (
        "h",
        (gen.request_id,),
        "no_responders",
    )
    assert isinstance(event, TokenBatch)
    assert event.finish_reason == "cancelled"
    [line] = _events(logs, "engine_unhealthy")
    assert (line["reason"], line["busy"]) == ("engine_stalled", True)


async def test_an_engine_that_resumes_comes_back(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo, logs: list[Any]
) -> None:
    async with running_mocker(
        nats_url, subjects, model_info, worker_id="h", hang_after_tokens=0, hang_for_s=1.0, **QUICK
    ) as mocker:
        await eventually_async(
            lambda: _events(logs, "engine_unhealthy"), timeout_s=WAIT_S, message="never unhealthy"
        )

        async def back() -> bool:
            return await _card_ids(nc, subjects) == {"h"} and await _answers_ping(nc, subjects, "h")

        await eventually_awaited(back, timeout_s=WAIT_S, message="the worker never came back")
        assert _sample(mocker, "jetserve_mocker_engine_healthy", worker_id="h") == 1
        async with Stream(nc, subjects) as stream:  # and it serves again
            await nc.publish(subjects.generate("h"), codec.encode(_generate(stream, max_tokens=4)))
            batches = await stream.until_finished(timeout_s=WAIT_S)
    assert sum(len(b.token_ids) for b in batches) == 4
    assert _events(logs, "engine_recovered")


async def test_a_healthy_workers_canaries_are_invisible_on_the_bus(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo, logs: list[Any]
) -> None:
    seen = await nc.subscribe(f"{subjects.namespace}.>")
    async with running_mocker(
        nats_url, subjects, model_info, worker_id="w", **{**QUICK, "health_check_idle_s": 0.05}
    ) as mocker:
        await eventually_async(
            lambda: len(_events(logs, "health_check_passed")) >= 3,
            timeout_s=WAIT_S,
            message="fewer than 3 canaries passed",
        )
        await nc.flush()
        messages = []
        while True:
            try:
                messages.append(await seen.next_msg(timeout=0.2))
            except nats.errors.TimeoutError:
                break
        assert await _card_ids(nc, subjects) == {"w"}
        assert _sample(mocker, "jetserve_mocker_engine_healthy", worker_id="w") == 1
        handled = _sample(mocker, "jetserve_messages_total", service="mocker", kind="generate")
        (worker,) = mocker.workers
        prompt_tokens = worker.engine.stats.prompt_tokens
    # no token batch, no lifecycle phase; load reports (a timed heartbeat) never show it
    subjects_seen = {msg.subject for msg in messages}
    assert not {s for s in subjects_seen if ".lifecycle." in s or ".stream." in s}, subjects_seen
    loads = [codec.decode(m.data, WorkerLoad) for m in messages if m.subject == subjects.load("w")]
    assert all((load.active, load.waiting) == (0, 0) for load in loads), loads
    assert not handled  # never counted as a request
    assert prompt_tokens == 0  # nor its prompt as a user's
    assert not _events(logs, "engine_unhealthy")
