"""The shared handler boundary on a real nats-server: decode, bind, count, typed failures."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from structlog.contextvars import get_contextvars, merge_contextvars
from structlog.testing import capture_logs

from shared import codec
from shared.bus import barrier
from shared.errors import ModelNotFound, ServiceError
from shared.handlers import Boundary
from shared.messages import Cancel, RequestFailed
from shared.metrics import ServiceMetrics
from shared.subjects import Subjects
from shared.tasks import TaskSet

TIMEOUT_S = 5.0


def _errors(metrics: ServiceMetrics, code: str) -> float:
    value = metrics.registry.get_sample_value(
        "jetserve_errors_total", {"service": "svc", "code": code}
    )
    return value or 0.0


def _handled(metrics: ServiceMetrics, kind: str) -> float:
    value = metrics.registry.get_sample_value(
        "jetserve_messages_total", {"service": "svc", "kind": kind}
    )
    return value or 0.0


class _Probe:
    """A handler that records what it saw, and fails as told by the cancel's ``reason``."""

    def __init__(self) -> None:
        self.seen: asyncio.Queue[tuple[str, dict[str, object]]] = asyncio.Queue()

    async def __call__(self, cancel: Cancel) -> None:
        await self.seen.put((cancel.request_id, dict(get_contextvars())))
        if cancel.reason == "typed":
            raise ModelNotFound("m")
        if cancel.reason == "crash":
            raise RuntimeError("boom")


async def _serve(
    nc: Client, subjects: Subjects, *, tasks: TaskSet | None = None
) -> tuple[ServiceMetrics, _Probe, list[tuple[Cancel, ServiceError]]]:
    metrics = ServiceMetrics("svc")
    probe = _Probe()
    cleaned: list[tuple[Cancel, ServiceError]] = []

    async def after(cancel: Cancel, exc: ServiceError) -> None:
        cleaned.append((cancel, exc))

    callback = Boundary(nc, metrics).handler(
        codec.decoder(Cancel),
        "cancel",
        probe,
        reply_to=lambda c: subjects.reply("gw", c.request_id),
        after_failure=after,
        tasks=tasks,
    )
    await nc.subscribe(subjects.cancel, cb=callback)
    await barrier(nc)
    return metrics, probe, cleaned


async def _replies(nc: Client, subjects: Subjects) -> asyncio.Queue[RequestFailed]:
    queue: asyncio.Queue[RequestFailed] = asyncio.Queue()

    async def on_reply(msg: Msg) -> None:
        await queue.put(codec.decode(msg.data, RequestFailed))

    await nc.subscribe(subjects.reply_all("gw"), cb=on_reply)
    await barrier(nc)
    return queue


async def test_handler_gets_the_decoded_message_with_its_request_id_bound(
    nc: Client, subjects: Subjects
) -> None:
    metrics, probe, _ = await _serve(nc, subjects)
    await nc.publish(subjects.cancel, codec.encode(Cancel(request_id="r1", reason="ok")))
    request_id, context = await asyncio.wait_for(probe.seen.get(), TIMEOUT_S)
    assert (request_id, context.get("request_id")) == ("r1", "r1")
    assert _handled(metrics, "cancel") == 1
    assert "request_id" not in get_contextvars()


async def test_typed_failure_is_replied_counted_and_cleaned_up(
    nc: Client, subjects: Subjects
) -> None:
    replies = await _replies(nc, subjects)
    metrics, _, cleaned = await _serve(nc, subjects)
    with capture_logs(processors=[merge_contextvars]) as logs:
        await nc.publish(subjects.cancel, codec.encode(Cancel(request_id="r2", reason="typed")))
        failed = await asyncio.wait_for(replies.get(), TIMEOUT_S)
    assert (failed.request_id, failed.code, failed.status) == ("r2", "model_not_found", 404)
    assert _errors(metrics, "model_not_found") == 1
    assert [exc.code for _, exc in cleaned] == ["model_not_found"]
    failures = [e for e in logs if e["event"] == "request_failed"]
    assert [(e["code"], e["request_id"]) for e in failures] == [("model_not_found", "r2")]


async def test_crash_is_logged_once_with_traceback_and_answered_internal_error(
    nc: Client, subjects: Subjects
) -> None:
    replies = await _replies(nc, subjects)
    metrics, _, _ = await _serve(nc, subjects)
    with capture_logs() as logs:
        await nc.publish(subjects.cancel, codec.encode(Cancel(request_id="r3", reason="crash")))
        failed = await asyncio.wait_for(replies.get(), TIMEOUT_S)
    assert (failed.code, failed.status) == ("internal_error", 500)
    assert "boom" not in failed.message  # nothing internal reaches the client
    crashes = [e for e in logs if e["event"] == "request_crashed"]
    assert len(crashes) == 1
    assert crashes[0]["exc_info"] is True
    assert _errors(metrics, "internal_error") == 1


async def test_undecodable_message_is_logged_counted_and_answered_on_its_reply(
    nc: Client, subjects: Subjects
) -> None:
    replies = await _replies(nc, subjects)
    metrics, probe, _ = await _serve(nc, subjects)
    with capture_logs() as logs:
        await nc.publish(subjects.cancel, b"\xc1 not msgpack", reply=subjects.reply("gw", "r4"))
        failed = await asyncio.wait_for(replies.get(), TIMEOUT_S)
    assert (failed.request_id, failed.code, failed.status) == ("r4", "invalid_request", 400)
    assert [e["event"] for e in logs] == ["message_undecodable"]
    assert _errors(metrics, "message_undecodable") == 1
    assert probe.seen.empty()


async def test_with_a_task_set_a_slow_message_does_not_hold_up_the_next(
    nc: Client, subjects: Subjects
) -> None:
    tasks = TaskSet()
    gate = asyncio.Event()
    order: list[str] = []

    async def slow_first(cancel: Cancel) -> None:
        if cancel.request_id == "slow":
            await gate.wait()
        order.append(cancel.request_id)
        if cancel.request_id == "fast":
            gate.set()

    callback = Boundary(nc, ServiceMetrics("svc")).handler(
        codec.decoder(Cancel), "cancel", slow_first, tasks=tasks
    )
    await nc.subscribe(subjects.cancel, cb=callback)
    await barrier(nc)
    for request_id in ("slow", "fast"):
        await nc.publish(subjects.cancel, codec.encode(Cancel(request_id=request_id)))
    await asyncio.wait_for(gate.wait(), TIMEOUT_S)
    assert await tasks.close(grace_s=TIMEOUT_S) == 0
    assert order == ["fast", "slow"]


@pytest.mark.parametrize("grace_s", [0.0, 0.05])
async def test_task_set_close_cancels_what_outlives_the_grace(grace_s: float) -> None:
    tasks = TaskSet()
    never = asyncio.Event()
    tasks.spawn(never.wait())
    tasks.spawn(asyncio.sleep(0))
    assert len(tasks) == 2
    assert await tasks.close(grace_s) == (1 if grace_s else 2)
    assert len(tasks) == 0
