"""Direct StreamOpen (decision 013): real preprocessor and formatter, router/worker by hand."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.formatter.config import FormatterConfig
from services.formatter.detokenizer import load_tokenizer
from services.formatter.service import FormatterService, build_service
from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.service import Preprocessor, serving
from shared import codec
from shared.messages import (
    Cancel,
    GatewayEvent,
    Generate,
    ModelCard,
    OutputOptions,
    Preprocess,
    RequestFailed,
    ResponseChunk,
    StreamOpen,
    TokenBatch,
)
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.registry import publish_model
from shared.subjects import Subjects
from tests.integration.formatter_support import running_formatter
from tests.support import eventually_async

MODEL = DEFAULT_MODEL_NAME
GATEWAY = "gw1"
FORMATTER = "f1"
TIMEOUT_S = 10.0

HANDSHAKE_S = 30.0
"""A test's first open is a handshake, answered once the formatter has loaded the 11 MB
tokenizer (1 s idle, 5 s seen in CI under load); these tests are not about its timeout."""


@pytest.fixture
async def published(nc: Client, subjects: Subjects, model_dir: Path) -> None:
    card = ModelCard(model=MODEL, context_length=40960, eos_token_ids=(151645,))
    await publish_model(nc.jetstream(), subjects, card, model_dir)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    return load_tokenizer((model_dir / "tokenizer.json").read_bytes())


@pytest.fixture
async def formatter(
    nats_url: str, subjects: Subjects, published: None
) -> AsyncIterator[FormatterService]:
    config = FormatterConfig(
        nats_url=nats_url, namespace=subjects.namespace, formatter_id=FORMATTER
    )
    async with running_formatter(config) as service:
        yield service


@pytest.fixture
async def preprocessor(
    nats_url: str, subjects: Subjects, published: None
) -> AsyncIterator[Preprocessor]:
    config = PreprocessorConfig(
        nats_url=nats_url, namespace=subjects.namespace, formatter_timeout_s=HANDSHAKE_S
    )
    async with serving(config) as service:
        yield service


@pytest.fixture
async def gateway(nc: Client, subjects: Subjects) -> Subscription:
    sub = await nc.subscribe(subjects.reply_all(GATEWAY))
    await nc.flush()
    return sub


@pytest.fixture
async def cancels(nc: Client, subjects: Subjects) -> Subscription:
    sub = await nc.subscribe(subjects.cancel)
    await nc.flush()
    return sub


class FakeWorker:
    """Plays router + worker: answers every routed ``Generate`` with two token batches."""

    def __init__(self, nc: Client, tokenizer: Any) -> None:
        self.nc = nc
        self.tokenizer = tokenizer
        self.generated: list[Generate] = []

    async def on_generate(self, msg: Msg) -> None:
        generate = codec.decode(msg.data, Generate)
        self.generated.append(generate)
        index = 0
        for n, text in enumerate(["Hello", " there"]):
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)
            batch = TokenBatch(
                request_id=generate.request_id,
                token_ids=ids,
                index=index,
                finish_reason="length" if n == 1 else None,
            )
            await self.nc.publish(generate.stream_to, codec.encode(batch))
            index += len(ids)


@pytest.fixture
async def worker(nc: Client, subjects: Subjects, tokenizer: Any) -> FakeWorker:
    fake = FakeWorker(nc, tokenizer)
    await nc.subscribe(subjects.route, queue="router", cb=fake.on_generate)
    await nc.flush()
    return fake


async def send(nc: Client, subjects: Subjects) -> str:
    """Publish a ``Preprocess`` as the gateway does; returns its request id."""
    request_id = uuid.uuid4().hex
    reply_to = subjects.reply(GATEWAY, request_id)
    req = Preprocess(
        request_id=request_id,
        api="completion",
        model=MODEL,
        reply_to=reply_to,
        created=1,
        prompt="Say hello",
        max_tokens=8,
    )
    await nc.publish(subjects.preprocess, codec.encode(req), reply=reply_to)
    return request_id


async def response(
    gateway: Subscription, timeout_s: float = TIMEOUT_S
) -> ResponseChunk | RequestFailed:
    msg = await gateway.next_msg(timeout=timeout_s)
    event: GatewayEvent = codec.GATEWAY_EVENTS.decode(msg.data)
    return event


def handled(formatter: FormatterService, kind: str) -> int:
    """How many ``kind`` messages the formatter has handled (``jetserve_messages_total``): a
    message is counted once its handler has returned."""
    return formatter.metrics.handlers.labels("formatter", kind).count


async def until_handled(formatter: FormatterService, kind: str, count: int) -> None:
    await eventually_async(
        lambda: handled(formatter, kind) == count,
        timeout_s=TIMEOUT_S,
        message=f"the formatter never handled {count} {kind} message(s)",
    )


async def served_directly(nc: Client, subjects: Subjects, gateway: Subscription) -> None:
    """One request opened directly and finished: its answer comes back (and the model's
    tokenizer is loaded from then on, so later opens are handled in their handler)."""
    request_id = uuid.uuid4().hex
    open_msg = stream_open(subjects, request_id)
    await nc.publish(subjects.formatter_open_direct(FORMATTER), codec.encode(open_msg))
    batch = TokenBatch(request_id=request_id, token_ids=(9707,), finish_reason="length")
    await nc.publish(subjects.stream(FORMATTER, request_id), codec.encode(batch))
    event = await response(gateway, HANDSHAKE_S)
    assert isinstance(event, ResponseChunk)
    assert (event.request_id, event.done) == (request_id, True)


def stream_open(subjects: Subjects, request_id: str, **output: Any) -> StreamOpen:
    return StreamOpen(
        request_id=request_id,
        api="completion",
        model=MODEL,
        reply_to=subjects.reply(GATEWAY, request_id),
        created=int(time.time()),
        prompt_tokens=3,
        output=OutputOptions(**output),
        max_tokens=8,
    )


@pytest.mark.usefixtures("formatter", "worker")
async def test_second_request_opens_directly_and_completes(
    nc: Client, subjects: Subjects, preprocessor: Preprocessor, gateway: Subscription
) -> None:
    direct = await nc.subscribe(subjects.formatter_open_direct(FORMATTER))
    await nc.flush()
    first = await send(nc, subjects)  # pool empty: request/reply, which teaches the pool
    event = await response(gateway)
    assert isinstance(event, ResponseChunk)
    assert event.request_id == first
    assert FORMATTER in preprocessor.formatters
    assert direct.pending_msgs == 0

    second = await send(nc, subjects)
    event = await response(gateway)
    assert isinstance(event, ResponseChunk)
    assert (event.request_id, event.done) == (second, True)
    assert b"Hello there" in event.data
    opened = codec.decode((await direct.next_msg(timeout=TIMEOUT_S)).data, StreamOpen)
    assert opened.request_id == second


async def test_batches_before_the_open_are_delivered_when_it_comes(
    nc: Client,
    subjects: Subjects,
    formatter: FormatterService,
    gateway: Subscription,
    tokenizer: Any,
) -> None:
    request_id = uuid.uuid4().hex
    stream_to = subjects.stream(FORMATTER, request_id)
    for n, text in enumerate(["Early", " bird"]):
        ids = tuple(tokenizer.encode(text, add_special_tokens=False).ids)
        batch = TokenBatch(
            request_id=request_id,
            token_ids=ids,
            index=0 if n == 0 else 1,
            finish_reason="stop" if n == 1 else None,
        )
        await nc.publish(stream_to, codec.encode(batch))
    await until_handled(formatter, "stream", 2)  # held: the open has not come
    assert gateway.pending_msgs == 0
    open_msg = stream_open(subjects, request_id, stream=True)
    await nc.publish(subjects.formatter_open_direct(FORMATTER), codec.encode(open_msg))
    data = b""
    while True:
        event = await response(gateway)
        assert isinstance(event, ResponseChunk)
        data += event.data
        if event.done:
            break
    frames = [f.removeprefix(b"data: ") for f in data.split(b"\n\n") if f]
    assert frames[-1] == b"[DONE]"
    text = "".join(json.loads(f)["choices"][0]["text"] for f in frames[:-1])
    assert text == "Early bird"


async def test_failure_before_the_open_is_forwarded_when_it_comes(
    nc: Client, subjects: Subjects, formatter: FormatterService, gateway: Subscription
) -> None:
    request_id = uuid.uuid4().hex
    failed = RequestFailed(
        request_id=request_id, code="no_worker_available", message="x", status=503
    )
    await nc.publish(subjects.stream(FORMATTER, request_id), codec.encode(failed))
    await until_handled(formatter, "stream", 1)  # held: the open has not come
    assert gateway.pending_msgs == 0
    open_msg = stream_open(subjects, request_id)
    await nc.publish(subjects.formatter_open_direct(FORMATTER), codec.encode(open_msg))
    event = await response(gateway)
    assert isinstance(event, RequestFailed)
    assert (event.request_id, event.status) == (request_id, 503)


@pytest.mark.usefixtures("formatter")
async def test_a_direct_open_that_fails_answers_the_gateway_and_cancels(
    nc: Client, subjects: Subjects, gateway: Subscription, cancels: Subscription
) -> None:
    request_id = uuid.uuid4().hex
    open_msg = stream_open(subjects, request_id)
    unknown = StreamOpen(**{**msgspec.structs.asdict(open_msg), "model": "no/such-model"})
    await nc.publish(subjects.formatter_open_direct(FORMATTER), codec.encode(unknown))
    event = await response(gateway)
    assert isinstance(event, RequestFailed)
    assert (event.request_id, event.status, event.code) == (request_id, 404, "model_not_found")
    cancel = codec.decode((await cancels.next_msg(timeout=TIMEOUT_S)).data, Cancel)
    assert (cancel.request_id, cancel.reason) == (request_id, "model_not_found")


async def test_open_after_cancel_is_ignored(
    nc: Client, subjects: Subjects, formatter: FormatterService, gateway: Subscription
) -> None:
    await served_directly(nc, subjects, gateway)
    request_id = uuid.uuid4().hex
    await nc.publish(subjects.cancel, codec.encode(Cancel(request_id=request_id)))
    await until_handled(formatter, "cancel", 1)
    open_msg = stream_open(subjects, request_id)
    await nc.publish(subjects.formatter_open_direct(FORMATTER), codec.encode(open_msg))
    await until_handled(formatter, "stream_open", 2)  # the tokenizer is loaded: handled inline
    assert formatter.in_flight == 0


@pytest.mark.usefixtures("formatter", "worker")
async def test_dead_formatter_in_the_pool_is_503_and_cancel(
    nc: Client,
    subjects: Subjects,
    preprocessor: Preprocessor,
    gateway: Subscription,
    cancels: Subscription,
) -> None:
    preprocessor.formatters.learn("ghost", time.monotonic())
    request_id = await send(nc, subjects)
    event = await response(gateway)
    assert isinstance(event, RequestFailed)
    assert (event.request_id, event.status, event.code) == (request_id, 503, "service_unavailable")
    assert event.retry_after_s
    cancel = codec.decode((await cancels.next_msg(timeout=TIMEOUT_S)).data, Cancel)
    assert (cancel.request_id, cancel.reason) == (request_id, "formatter_unavailable")
    assert "ghost" not in preprocessor.formatters
    # The next request rediscovers a live formatter and goes through.
    await send(nc, subjects)
    assert isinstance(await response(gateway), ResponseChunk)


async def test_direct_open_off_always_shakes_hands(
    nats_url: str,
    nc: Client,
    subjects: Subjects,
    formatter: FormatterService,
    worker: FakeWorker,
    gateway: Subscription,
) -> None:
    config = PreprocessorConfig(
        nats_url=nats_url,
        namespace=subjects.namespace,
        direct_open=False,
        formatter_timeout_s=HANDSHAKE_S,
    )
    async with serving(config) as service:
        service.formatters.learn("ghost", time.monotonic())
        await send(nc, subjects)
        event = await response(gateway)
    assert isinstance(event, ResponseChunk)


@pytest.mark.usefixtures("published", "worker")
async def test_a_stopping_formatter_leaves_the_pool_without_failing_requests(
    nats_url: str,
    nc: Client,
    subjects: Subjects,
    preprocessor: Preprocessor,
    gateway: Subscription,
) -> None:
    config = FormatterConfig(nats_url=nats_url, namespace=subjects.namespace, formatter_id="f2")
    client = await nats.connect(nats_url)
    service = build_service(config, client)
    await service.start()
    try:
        await send(nc, subjects)
        assert isinstance(await response(gateway), ResponseChunk)
        assert "f2" in preprocessor.formatters
        # An open already on its way when the formatter starts leaving is still served.
        leaving = await nc.subscribe(subjects.formatter_leaving("f2"))
        await nc.flush()
        request_id = uuid.uuid4().hex
        open_msg = stream_open(subjects, request_id)
        stopping = asyncio.create_task(service.stop())
        await leaving.next_msg(timeout=TIMEOUT_S)  # it is leaving: opens still come a moment
        await nc.publish(subjects.formatter_open_direct("f2"), codec.encode(open_msg))
        batch = TokenBatch(request_id=request_id, token_ids=(9707,), finish_reason="length")
        await nc.publish(subjects.stream("f2", request_id), codec.encode(batch))
        event = await response(gateway)
        assert isinstance(event, ResponseChunk)
        assert (event.request_id, event.done) == (request_id, True)
        await stopping
        assert "f2" not in preprocessor.formatters
    finally:
        await client.drain()
