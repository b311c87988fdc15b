"""Decision 018 in the formatter, on a real nats-server: numbered chunks and their replay, a
gateway's grace, holes in token batches, and stalled requests checked with ``WorkerPing``.

The test plays the preprocessor (``StreamOpen``), the worker (batches, ``WorkerPong``), the
routers (the route subject) and the gateway (reply subject, ``StreamResume``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.formatter import service as formatter_service
from services.formatter.config import FormatterConfig
from services.formatter.detokenizer import load_tokenizer
from services.formatter.recovery import GATEWAY_GRACE_S, STALL_CHECK_S
from services.formatter.service import FormatterService
from shared import codec
from shared.messages import (
    Cancel,
    Generate,
    ModelCard,
    OutputOptions,
    RequestFailed,
    ResponseChunk,
    SamplingParams,
    StreamHeld,
    StreamOpen,
    StreamOpened,
    StreamResume,
    TokenBatch,
    WorkerPing,
    WorkerPong,
)
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.registry import publish_model
from shared.subjects import Subjects
from tests.integration.formatter_support import running_formatter

MODEL = DEFAULT_MODEL_NAME
FORMATTER = "f1"
GATEWAY = "gw1"
WORKER = "w1"
PROMPT = (1, 2, 3)
MAX_TOKENS = 64
TIMEOUT_S = 10.0
HANDSHAKE_S = 30.0
"""The first open waits for the 11 MB tokenizer to load (seconds under load in CI)."""
SILENCE_S = 1.0
"""How long "nothing comes" is watched for."""
HANG_S = 30.0
"""A wait only a hang runs into."""
NEVER_S = 3600.0
"""A check interval no test lasts."""


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    return load_tokenizer((model_dir / "tokenizer.json").read_bytes())


@pytest.fixture
async def formatter(
    nats_url: str, nc: Client, subjects: Subjects, model_dir: Path
) -> AsyncIterator[FormatterService]:
    card = ModelCard(model=MODEL, context_length=40960)
    await publish_model(nc.jetstream(), subjects, card, model_dir)
    config = FormatterConfig(
        nats_url=nats_url,
        namespace=subjects.namespace,
        formatter_id=FORMATTER,
        idle_timeout_s=30.0,
        shutdown_grace_s=1.0,
    )
    async with running_formatter(config) as service:
        yield service


async def subscribe(nc: Client, subject: str, **kwargs: Any) -> Subscription:
    sub = await nc.subscribe(subject, **kwargs)
    await nc.flush()
    return sub


async def gone(sub: Subscription) -> None:
    """Unsubscribe a ``next_msg`` subscription: draining one with messages left would wait for
    nats-py's drain timeout (30 s)."""
    with contextlib.suppress(nats.errors.Error):
        await sub.unsubscribe()


@pytest.fixture
async def gateway(nc: Client, subjects: Subjects) -> AsyncIterator[Subscription]:
    sub = await subscribe(nc, subjects.reply_all(GATEWAY))
    yield sub
    await gone(sub)


@pytest.fixture
async def cancels(nc: Client, subjects: Subjects) -> AsyncIterator[Subscription]:
    sub = await subscribe(nc, subjects.cancel)
    yield sub
    await gone(sub)


@pytest.fixture
async def routes(nc: Client, subjects: Subjects) -> AsyncIterator[Subscription]:
    """What the routers would receive: migrated ``Generate`` messages."""
    sub = await subscribe(nc, subjects.route, queue="router")
    yield sub
    await gone(sub)


class FakeWorker:
    """Answers the formatter's ``WorkerPing`` with ``held`` and keeps what it was asked."""

    def __init__(self, nc: Client, *, held: bool) -> None:
        self.nc = nc
        self.held = held
        self.pings: asyncio.Queue[WorkerPing] = asyncio.Queue()

    async def on_ping(self, msg: Msg) -> None:
        ping = codec.decode(msg.data, WorkerPing)
        self.pings.put_nowait(ping)
        pong = WorkerPong(request_id=ping.request_id, held=self.held)
        await msg.respond(codec.encode(pong))

    async def serve(self, subjects: Subjects) -> None:
        await subscribe(self.nc, subjects.worker_ping(WORKER), cb=self.on_ping)


@pytest.fixture
async def worker(nc: Client, subjects: Subjects) -> FakeWorker:
    """The worker of every request, alive and holding it: stall checks find nothing wrong."""
    fake = FakeWorker(nc, held=True)
    await fake.serve(subjects)
    return fake


class Request:
    """One request opened on the formatter, and the worker side of it."""

    def __init__(self, nc: Client, tokenizer: Any, request_id: str, stream_to: str) -> None:
        self.nc = nc
        self.tokenizer = tokenizer
        self.request_id = request_id
        self.stream_to = stream_to

    def ids(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)

    async def batch(
        self, ids: tuple[int, ...], index: int, *, finish: Any = None, attempt: int = 0
    ) -> None:
        batch = TokenBatch(
            request_id=self.request_id,
            token_ids=ids,
            index=index,
            finish_reason=finish,
            worker_id=WORKER,
            attempt=attempt,
        )
        await self.nc.publish(self.stream_to, codec.encode(batch))

    async def texts(self, texts: list[str], *, finish: Any = None) -> int:
        """One batch per text from position 0; the next position."""
        index = 0
        for n, text in enumerate(texts):
            ids = self.ids(text)
            await self.batch(ids, index, finish=finish if n == len(texts) - 1 else None)
            index += len(ids)
        return index

    async def resume(self, subjects: Subjects, from_seq: int, timeout_s: float = TIMEOUT_S) -> Msg:
        resume = StreamResume(request_id=self.request_id, from_seq=from_seq)
        return await self.nc.request(subjects.stream_resume, codec.encode(resume), timeout_s)


async def open_request(nc: Client, subjects: Subjects, tokenizer: Any) -> Request:
    """A streaming chat request that may migrate (decision 017)."""
    request_id = uuid.uuid4().hex
    generate = Generate(
        request_id=request_id,
        model=MODEL,
        token_ids=PROMPT,
        sampling=SamplingParams(max_tokens=MAX_TOKENS),
        stream_to="",
    )
    request = StreamOpen(
        request_id=request_id,
        api="chat",
        model=MODEL,
        reply_to=subjects.reply(GATEWAY, request_id),
        created=int(time.time()),
        prompt_tokens=len(PROMPT),
        output=OutputOptions(stream=True),
        max_tokens=MAX_TOKENS,
        generate=generate,
        migration_limit=3,
    )
    reply = await nc.request(subjects.formatter_open, codec.encode(request), timeout=HANDSHAKE_S)
    opened = codec.decode(reply.data, StreamOpened)
    return Request(nc, tokenizer, request_id, opened.stream_to)


async def chunks(gateway: Subscription, count: int) -> list[ResponseChunk]:
    found = []
    for _ in range(count):
        event = codec.GATEWAY_EVENTS.decode((await gateway.next_msg(timeout=TIMEOUT_S)).data)
        assert isinstance(event, ResponseChunk)
        found.append(event)
    return found


async def nothing_on(sub: Subscription, within_s: float = SILENCE_S) -> None:
    try:
        msg = await sub.next_msg(timeout=within_s)
    except nats.errors.TimeoutError:
        return
    pytest.fail(f"unexpected message on {msg.subject}: {msg.data!r}")


def content(received: list[ResponseChunk]) -> str:
    """The text of SSE chat chunks."""
    data = b"".join(c.data for c in received)
    frames = [f.removeprefix(b"data: ") for f in data.split(b"\n\n") if f]
    objects = [json.loads(f) for f in frames if f != b"[DONE]"]
    return "".join(o["choices"][0]["delta"].get("content", "") for o in objects if o["choices"])


# --- (a) numbered chunks and their replay ---------------------------------------------------


@pytest.mark.usefixtures("formatter", "worker")
async def test_chunks_are_numbered_and_a_resume_sends_them_again_in_order(
    nc: Client, subjects: Subjects, gateway: Subscription, tokenizer: Any
) -> None:
    request = await open_request(nc, subjects, tokenizer)
    await request.texts(["Hello", " there", " world"])
    sent = await chunks(gateway, 3)
    assert [c.seq for c in sent] == [0, 1, 2]
    held = codec.decode((await request.resume(subjects, from_seq=1)).data, StreamHeld)
    assert (held.holder, held.first_seq, held.next_seq) == ("formatter", 0, 3)
    assert await chunks(gateway, 2) == sent[1:]


@pytest.mark.usefixtures("formatter", "worker")
async def test_nobody_answers_for_an_unknown_or_undecodable_request(
    nc: Client, subjects: Subjects, gateway: Subscription, tokenizer: Any
) -> None:
    unknown = Request(nc, tokenizer, uuid.uuid4().hex, "")
    with pytest.raises(nats.errors.TimeoutError):
        await unknown.resume(subjects, from_seq=0, timeout_s=SILENCE_S)
    with pytest.raises(nats.errors.TimeoutError):
        await nc.request(subjects.stream_resume, b"\xc1 not msgpack", timeout=SILENCE_S)
    request = await open_request(nc, subjects, tokenizer)  # the formatter goes on
    held = codec.decode((await request.resume(subjects, from_seq=0)).data, StreamHeld)
    assert (held.first_seq, held.next_seq) == (0, 0)
    await nothing_on(gateway)


@pytest.mark.usefixtures("formatter", "worker")
async def test_the_last_chunk_of_a_finished_request_is_sent_again(
    nc: Client, subjects: Subjects, gateway: Subscription, tokenizer: Any
) -> None:
    request = await open_request(nc, subjects, tokenizer)
    await request.texts(["Hello", " there"], finish="length")
    sent = await chunks(gateway, 2)
    assert sent[-1].done
    held = codec.decode((await request.resume(subjects, from_seq=1)).data, StreamHeld)
    assert (held.first_seq, held.next_seq) == (0, 2)
    assert await chunks(gateway, 1) == [sent[-1]]


@pytest.mark.usefixtures("formatter", "worker")
async def test_a_failed_request_sends_its_failure_again(
    nc: Client, subjects: Subjects, gateway: Subscription, tokenizer: Any
) -> None:
    request = await open_request(nc, subjects, tokenizer)
    failed = RequestFailed(request_id=request.request_id, code="internal_error", message="x")
    await nc.publish(request.stream_to, codec.encode(failed))
    assert codec.decode((await gateway.next_msg(timeout=TIMEOUT_S)).data, RequestFailed) == failed
    await request.resume(subjects, from_seq=0)
    assert codec.decode((await gateway.next_msg(timeout=TIMEOUT_S)).data, RequestFailed) == failed


# --- (b) a gateway that moves ---------------------------------------------------------------


@pytest.mark.usefixtures("formatter", "worker")
async def test_a_gateway_that_comes_back_within_the_grace_gets_the_rest(
    nc: Client, subjects: Subjects, gateway: Subscription, cancels: Subscription, tokenizer: Any
) -> None:
    request = await open_request(nc, subjects, tokenizer)
    hello, there = request.ids("Hello"), request.ids(" there")
    await request.batch(hello, 0)
    await chunks(gateway, 1)
    await gateway.unsubscribe()  # the gateway moves to another node
    await nc.flush()
    await request.batch(there, len(hello))  # its chunk bounces
    await nothing_on(cancels)
    back = await subscribe(nc, subjects.reply_all(GATEWAY))
    held = codec.decode((await request.resume(subjects, from_seq=1)).data, StreamHeld)
    assert held.next_seq == 2
    [missed] = await chunks(back, 1)
    assert missed.seq == 1
    await nothing_on(cancels, GATEWAY_GRACE_S + 1.5)  # the resume ended the grace
    await request.batch(request.ids(" world"), len(hello) + len(there), finish="length")
    [done] = await chunks(back, 1)
    await gone(back)
    assert (done.seq, done.done) == (2, True)


@pytest.mark.usefixtures("formatter", "worker")
async def test_a_gateway_away_past_the_grace_has_its_worker_cancelled(
    nc: Client, subjects: Subjects, gateway: Subscription, cancels: Subscription, tokenizer: Any
) -> None:
    request = await open_request(nc, subjects, tokenizer)
    await request.batch(request.ids("Hello"), 0)
    await chunks(gateway, 1)
    await gateway.unsubscribe()
    await nc.flush()
    bounced_at = time.monotonic()
    await request.batch(request.ids(" there"), 1)
    msg = await cancels.next_msg(timeout=GATEWAY_GRACE_S + TIMEOUT_S)
    waited_s = time.monotonic() - bounced_at
    cancel = codec.decode(msg.data, Cancel)
    assert (cancel.request_id, cancel.reason, cancel.worker_id) == (
        request.request_id,
        "gateway_gone",
        None,
    )
    assert waited_s >= GATEWAY_GRACE_S * 0.9


# --- (c) holes in token batches ---------------------------------------------------------------


@pytest.mark.usefixtures("formatter", "worker")
async def test_a_hole_in_the_batches_migrates_from_the_tokens_received(
    nc: Client,
    subjects: Subjects,
    gateway: Subscription,
    cancels: Subscription,
    routes: Subscription,
    tokenizer: Any,
) -> None:
    request = await open_request(nc, subjects, tokenizer)
    hello = request.ids("Hello")
    await request.batch(hello, 0)
    await chunks(gateway, 1)
    await request.batch(request.ids(" world"), len(hello) + 5)  # batches in between were lost
    generate = codec.decode((await routes.next_msg(timeout=TIMEOUT_S)).data, Generate)
    assert (generate.attempt, generate.token_ids, generate.resumed_tokens) == (
        1,
        PROMPT + hello,
        len(hello),
    )
    assert generate.sampling.max_tokens == MAX_TOKENS - len(hello)
    assert generate.stream_to == subjects.stream(FORMATTER, request.request_id)
    cancel = codec.decode((await cancels.next_msg(timeout=TIMEOUT_S)).data, Cancel)
    assert (cancel.request_id, cancel.worker_id, cancel.reason) == (
        request.request_id,
        WORKER,
        "migrated",
    )
    await request.batch(request.ids(" there"), 0, finish="length", attempt=1)
    [done] = await chunks(gateway, 1)
    assert (done.seq, done.done) == (1, True)


@pytest.mark.usefixtures("formatter", "worker")
async def test_a_repeated_batch_is_dropped(
    nc: Client, subjects: Subjects, gateway: Subscription, routes: Subscription, tokenizer: Any
) -> None:
    request = await open_request(nc, subjects, tokenizer)
    hello = request.ids("Hello")
    await request.batch(hello, 0)
    await request.batch(hello, 0)
    await request.batch(request.ids(" there"), len(hello), finish="length")
    received = await chunks(gateway, 2)
    assert (content(received), received[-1].done) == ("Hello there", True)
    await nothing_on(routes, 0.2)


# --- (d) stalled requests: does the worker still hold it? ------------------------------------


@pytest.mark.usefixtures("formatter")
@pytest.mark.parametrize("worker_is", ["answers_not_held", "gone"])
async def test_a_stalled_request_its_worker_no_longer_holds_migrates(
    nc: Client,
    subjects: Subjects,
    gateway: Subscription,
    routes: Subscription,
    tokenizer: Any,
    worker_is: str,
) -> None:
    fake = FakeWorker(nc, held=False)
    if worker_is == "answers_not_held":
        await fake.serve(subjects)
    request = await open_request(nc, subjects, tokenizer)
    hello = request.ids("Hello")
    await request.batch(hello, 0)
    await chunks(gateway, 1)
    msg = await routes.next_msg(timeout=STALL_CHECK_S + TIMEOUT_S)
    generate = codec.decode(msg.data, Generate)
    assert (generate.attempt, generate.resumed_tokens) == (1, len(hello))
    if worker_is == "answers_not_held":
        ping = fake.pings.get_nowait()
        assert (ping.request_id, ping.attempt) == (request.request_id, 0)


@pytest.mark.usefixtures("formatter")
async def test_a_stalled_request_its_worker_holds_stays(
    nc: Client,
    subjects: Subjects,
    gateway: Subscription,
    routes: Subscription,
    worker: FakeWorker,
    tokenizer: Any,
) -> None:
    request = await open_request(nc, subjects, tokenizer)
    await request.batch(request.ids("Hello"), 0)
    await chunks(gateway, 1)
    ping = await asyncio.wait_for(worker.pings.get(), STALL_CHECK_S + TIMEOUT_S)
    assert ping.request_id == request.request_id
    await nothing_on(routes)


async def test_a_reconnect_checks_every_routed_request_at_once(
    nc: Client,
    subjects: Subjects,
    formatter: FormatterService,
    gateway: Subscription,
    worker: FakeWorker,
    tokenizer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sweeper's stall check never comes due here: a ping can only be the reconnect's.
    monkeypatch.setattr(formatter_service, "STALL_CHECK_S", NEVER_S)
    request = await open_request(nc, subjects, tokenizer)
    await request.batch(request.ids("Hello"), 0)
    await chunks(gateway, 1)
    await formatter.on_bus_back()
    ping = await asyncio.wait_for(worker.pings.get(), HANG_S)
    assert ping.request_id == request.request_id
