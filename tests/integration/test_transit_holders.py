"""Who holds a request (decision 018), against a real nats-server: a worker answers a formatter's
``WorkerPing``, waits out a bounced formatter's grace, and a preprocessor answers ``StreamResume``
for a request it is still preparing."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from services.mocker.service import ModelInfo
from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.service import Preprocessor, serving
from shared import codec
from shared.messages import (
    Cancel,
    Generate,
    ModelCard,
    Preprocess,
    RequestFailed,
    SamplingParams,
    StreamHeld,
    StreamOpen,
    StreamOpened,
    StreamResume,
    TokenBatch,
    WorkerPing,
    WorkerPong,
)
from shared.registry import publish_model
from shared.subjects import Subjects
from shared.worker.grace import FORMATTER_GRACE_S
from tests.integration.test_router_mocker import MODEL, PROMPT, Stream, running_mocker
from tests.support import eventually_async, eventually_awaited

WORKER = "w"
GATEWAY = "g1"
AFTER_GRACE_S = FORMATTER_GRACE_S + 2.0
"""Long enough for a grace to have run out, with room for a busy machine."""
NOT_ANSWERED_S = 0.3
"""How long a question nobody should answer is given (the answer, when due, takes ~1 ms)."""


def _generate(request_id: str, stream_to: str, **fields: Any) -> Generate:
    """A long request for worker ``w`` (still running seconds later at speedup 1)."""
    return Generate(
        **{
            "request_id": request_id,
            "model": MODEL,
            "token_ids": PROMPT,
            "sampling": SamplingParams(max_tokens=5000, ignore_eos=True),
            "stream_to": stream_to,
            "worker_id": WORKER,
            **fields,
        }
    )


async def _answer(msg: Msg) -> None:
    await msg.respond(b"")


async def _send(nc: Client, subjects: Subjects, gen: Generate) -> None:
    await nc.publish(subjects.generate(WORKER), codec.encode(gen))
    await nc.flush()


async def _is_held(nc: Client, subjects: Subjects, request_id: str, attempt: int = 0) -> bool:
    ping = WorkerPing(request_id=request_id, attempt=attempt)
    answer = await nc.request(subjects.worker_ping(WORKER), codec.encode(ping), timeout=2)
    pong = codec.decode(answer.data, WorkerPong)
    assert pong.request_id == request_id
    return pong.held


async def _until_held(nc: Client, subjects: Subjects, request_id: str, attempt: int = 0) -> None:
    """The worker admits a Generate a moment after it was published."""
    await eventually_awaited(
        lambda: _is_held(nc, subjects, request_id, attempt),
        message=f"{request_id} was never held",
    )


async def _until_logged(logs: list[MutableMapping[str, Any]], event: str, request_id: str) -> None:
    await eventually_async(
        lambda: any(e["event"] == event and e.get("request_id") == request_id for e in logs),
        timeout_s=5,
        message=f"{event} was never logged for {request_id}",
    )


@pytest.fixture
async def slow_worker(
    nats_url: str, subjects: Subjects, model_info: ModelInfo
) -> AsyncIterator[None]:
    """Worker ``w`` at realistic speed, one request running at a time (others queue)."""
    async with running_mocker(
        nats_url, subjects, model_info, worker_id=WORKER, speedup_ratio=1.0, max_num_seqs=1
    ):
        yield


@pytest.fixture
async def gateway(nc: Client, subjects: Subjects) -> AsyncIterator[Subscription]:
    """Where workers tell the gateway its formatter is lost."""
    sub = await nc.subscribe(subjects.reply_all(GATEWAY))
    await nc.flush()
    yield sub
    await sub.unsubscribe()  # a message nobody read would hold up the client's drain


@pytest.mark.usefixtures("slow_worker")
class TestWorkerPing:
    async def test_a_running_request_is_held_at_its_attempt_only(
        self, nc: Client, subjects: Subjects
    ) -> None:
        async with Stream(nc, subjects) as stream:
            await _send(nc, subjects, _generate(stream.request_id, stream.subject, attempt=2))
            assert isinstance(await stream.next(), TokenBatch)
            held = [await _is_held(nc, subjects, stream.request_id, a) for a in (2, 1, 3)]
        assert held == [True, False, False]

    async def test_a_queued_request_is_held(self, nc: Client, subjects: Subjects) -> None:
        queued_id = uuid.uuid4().hex
        queued = await nc.subscribe(subjects.stream("f1", queued_id))
        async with Stream(nc, subjects) as running:
            await _send(nc, subjects, _generate(running.request_id, running.subject))
            await _send(nc, subjects, _generate(queued_id, subjects.stream("f1", queued_id)))
            assert isinstance(await running.next(), TokenBatch)
            await _until_held(nc, subjects, queued_id)
            assert queued.pending_msgs == 0  # waiting behind the running one (max_num_seqs=1)
        await queued.unsubscribe()

    async def test_an_unknown_request_is_not_held(self, nc: Client, subjects: Subjects) -> None:
        assert not await _is_held(nc, subjects, uuid.uuid4().hex)

    async def test_a_cancelled_request_is_not_held(self, nc: Client, subjects: Subjects) -> None:
        async with Stream(nc, subjects) as stream:
            await _send(nc, subjects, _generate(stream.request_id, stream.subject))
            assert isinstance(await stream.next(), TokenBatch)
            cancel = Cancel(request_id=stream.request_id)
            await nc.publish(subjects.cancel, codec.encode(cancel))
            batches = await stream.until_finished()
        assert batches[-1].finish_reason == "cancelled"
        assert not await _is_held(nc, subjects, stream.request_id)

    async def test_an_empty_ping_still_gets_an_empty_answer(
        self, nc: Client, subjects: Subjects
    ) -> None:
        answer = await nc.request(subjects.worker_ping(WORKER), b"", timeout=2)
        assert answer.data == b""

    async def test_an_undecodable_ping_is_not_answered_and_breaks_nothing(
        self, nc: Client, subjects: Subjects
    ) -> None:
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request(
                subjects.worker_ping(WORKER), b"\xc1not msgpack", timeout=NOT_ANSWERED_S
            )
        assert not await _is_held(nc, subjects, uuid.uuid4().hex)


@contextlib.asynccontextmanager
async def _bouncing(
    nc: Client, subjects: Subjects
) -> AsyncIterator[tuple[str, str, list[MutableMapping[str, Any]]]]:
    """A request whose stream subject nobody listens on, once its first batch has bounced:
    its id, its stream subject, and the log lines captured meanwhile."""
    request_id = uuid.uuid4().hex
    stream_to = subjects.stream("f1", request_id)
    gen = _generate(request_id, stream_to, reply_to=subjects.reply(GATEWAY, request_id))
    with capture_logs(processors=[merge_contextvars]) as logs:
        await _send(nc, subjects, gen)
        await _until_logged(logs, "formatter_unreachable", request_id)
        yield request_id, stream_to, logs


@pytest.mark.usefixtures("slow_worker")
class TestBounceGrace:
    async def test_formatter_lost_reaches_the_gateway_only_after_the_grace(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        request_id = uuid.uuid4().hex
        nobody = subjects.stream("gone", request_id)
        gen = _generate(request_id, nobody, reply_to=subjects.reply(GATEWAY, request_id))
        sent_at = time.monotonic()
        await _send(nc, subjects, gen)
        await _until_held(nc, subjects, request_id)
        msg = await gateway.next_msg(timeout=AFTER_GRACE_S + 3)
        waited_s = time.monotonic() - sent_at
        failed = codec.decode(msg.data, RequestFailed)
        assert (failed.request_id, failed.code, failed.status) == (
            request_id,
            "formatter_lost",
            503,
        )
        assert waited_s >= FORMATTER_GRACE_S * 0.9, f"told after {waited_s:.2f}s"
        assert not await _is_held(nc, subjects, request_id)

    async def test_a_request_is_still_held_during_its_grace(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        async with _bouncing(nc, subjects) as (request_id, _, _):
            assert await _is_held(nc, subjects, request_id)

    async def test_a_formatter_that_comes_back_keeps_the_request(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        async with _bouncing(nc, subjects) as (request_id, stream_to, logs):
            back = await nc.subscribe(stream_to)  # the formatter, on its new NATS node
            pong = await nc.subscribe(subjects.formatter_ping("f1"), cb=_answer)
            await nc.flush()
            first = codec.decode((await back.next_msg(timeout=5)).data, TokenBatch)
            with pytest.raises(nats.errors.TimeoutError):
                await gateway.next_msg(timeout=AFTER_GRACE_S)
            assert await _is_held(nc, subjects, request_id)
            await _until_logged(logs, "formatter_back", request_id)
        assert first.index > 0  # it kept generating while the formatter was away
        await back.unsubscribe()
        await pong.unsubscribe()

    async def test_a_request_that_finished_in_its_grace_still_has_its_gateway_told(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        """Its last batch bounced too: only the worker can tell the gateway."""
        request_id = uuid.uuid4().hex
        stream_to = subjects.stream("gone", request_id)
        short = SamplingParams(max_tokens=8, ignore_eos=True)
        reply_to = subjects.reply(GATEWAY, request_id)
        await _send(
            nc, subjects, _generate(request_id, stream_to, reply_to=reply_to, sampling=short)
        )
        msg = await gateway.next_msg(timeout=AFTER_GRACE_S + 3)
        failed = codec.decode(msg.data, RequestFailed)
        assert (failed.request_id, failed.code) == (request_id, "formatter_lost")

    async def test_a_formatter_that_migrates_the_request_gets_no_formatter_lost(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        async with _bouncing(nc, subjects) as (request_id, stream_to, _):
            pass
        back = await nc.subscribe(stream_to)
        cancel = Cancel(request_id=request_id, reason="migrated", worker_id=WORKER)
        await nc.publish(subjects.cancel, codec.encode(cancel))
        with pytest.raises(nats.errors.TimeoutError):
            await gateway.next_msg(timeout=AFTER_GRACE_S)
        assert not await _is_held(nc, subjects, request_id)
        await back.unsubscribe()


# --- preprocessor ----------------------------------------------------------------------------


class HeldFormatter:
    """Answers ``StreamOpen`` only when released: the preprocessor is still preparing till then."""

    def __init__(self, subjects: Subjects) -> None:
        self.subjects = subjects
        self.opened: asyncio.Queue[str] = asyncio.Queue()
        self.release = asyncio.Event()

    async def on_open(self, msg: Msg) -> None:
        req = codec.decode(msg.data, StreamOpen)
        self.opened.put_nowait(req.request_id)
        await asyncio.wait_for(self.release.wait(), timeout=10)
        stream_to = self.subjects.stream("f1", req.request_id)
        await msg.respond(
            codec.encode(StreamOpened(request_id=req.request_id, stream_to=stream_to))
        )


@pytest.fixture
async def preprocessor(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> AsyncIterator[Preprocessor]:
    card = ModelCard(model=MODEL, context_length=40960, eos_token_ids=model_info.eos_token_ids)
    await publish_model(nc.jetstream(), subjects, card, model_info.model_dir)
    config = PreprocessorConfig(
        nats_url=nats_url, namespace=subjects.namespace, formatter_timeout_s=10.0
    )
    async with serving(config) as service:
        yield service


@pytest.fixture
async def held_formatter(nc: Client, subjects: Subjects) -> AsyncIterator[HeldFormatter]:
    fake = HeldFormatter(subjects)
    sub = await nc.subscribe(subjects.formatter_open, queue="formatter", cb=fake.on_open)
    await nc.flush()
    yield fake
    fake.release.set()
    await sub.unsubscribe()


async def _preprocess(nc: Client, subjects: Subjects) -> str:
    request_id = uuid.uuid4().hex
    req = Preprocess(
        request_id=request_id,
        reply_to=subjects.reply(GATEWAY, request_id),
        api="chat",
        model=MODEL,
        created=1,
        messages=({"role": "user", "content": "hello"},),
        max_tokens=8,
    )
    await nc.publish(subjects.preprocess, codec.encode(req))
    return request_id


async def _resume(
    nc: Client, subjects: Subjects, request_id: str, timeout_s: float = 2.0
) -> StreamHeld:
    ask = codec.encode(StreamResume(request_id=request_id))
    answer = await nc.request(subjects.stream_resume, ask, timeout=timeout_s)
    return codec.decode(answer.data, StreamHeld)


@pytest.mark.usefixtures("preprocessor")
class TestPreprocessorHolds:
    async def test_a_request_being_prepared_is_held_by_the_preprocessor(
        self, nc: Client, subjects: Subjects, held_formatter: HeldFormatter
    ) -> None:
        request_id = await _preprocess(nc, subjects)
        assert await asyncio.wait_for(held_formatter.opened.get(), 10) == request_id
        held = await _resume(nc, subjects, request_id)
        assert (held.request_id, held.holder) == (request_id, "preprocessor")

    async def test_a_request_sent_on_is_not_answered(
        self, nc: Client, subjects: Subjects, held_formatter: HeldFormatter
    ) -> None:
        router = await nc.subscribe(subjects.route, queue="router")
        held_formatter.release.set()
        request_id = await _preprocess(nc, subjects)
        routed = codec.decode((await router.next_msg(timeout=10)).data, Generate)
        assert routed.request_id == request_id
        with pytest.raises(nats.errors.TimeoutError):
            await _resume(nc, subjects, request_id, timeout_s=NOT_ANSWERED_S)

    async def test_an_unknown_request_is_not_answered(self, nc: Client, subjects: Subjects) -> None:
        with pytest.raises(nats.errors.TimeoutError):
            await _resume(nc, subjects, uuid.uuid4().hex, timeout_s=NOT_ANSWERED_S)

    async def test_an_undecodable_resume_is_not_answered(
        self, nc: Client, subjects: Subjects
    ) -> None:
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request(subjects.stream_resume, b"\xc1not msgpack", timeout=NOT_ANSWERED_S)
        with pytest.raises(nats.errors.TimeoutError):
            await _resume(nc, subjects, uuid.uuid4().hex, timeout_s=NOT_ANSWERED_S)
