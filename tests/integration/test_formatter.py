"""The formatter in-process against a real nats-server: handshake, SSE out, cancel, failures."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from services.formatter.config import FormatterConfig
from services.formatter.detokenizer import load_tokenizer
from services.formatter.service import FormatterService, build_service
from shared import codec
from shared.messages import (
    Cancel,
    GatewayEvent,
    ModelCard,
    OutputOptions,
    RequestFailed,
    ResponseChunk,
    StreamOpen,
    StreamOpened,
    TensorResult,
    TokenBatch,
)
from shared.model_dir import DEFAULT_MODEL_NAME, ensure_default_model_dir
from shared.registry import publish_model
from shared.subjects import Subjects
from tests.support import eventually_async

MODEL = DEFAULT_MODEL_NAME
GATEWAY_ID = "gw1"
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model_dir(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    return load_tokenizer((model_dir / "tokenizer.json").read_bytes())


@pytest.fixture
async def published(nc: Client, subjects: Subjects, model_dir: Path) -> None:
    card = ModelCard(model=MODEL, context_length=40960)
    await publish_model(nc.jetstream(), subjects, card, model_dir)


async def start_formatter(
    nats_url: str, subjects: Subjects, **options: Any
) -> tuple[FormatterService, Client]:
    config = FormatterConfig(
        nats_url=nats_url, namespace=subjects.namespace, formatter_id="f1", **options
    )
    client = await nats.connect(nats_url)
    service = build_service(config, client)
    await service.start()
    return service, client


@pytest.fixture
async def formatter(
    nats_url: str, subjects: Subjects, published: None
) -> AsyncIterator[FormatterService]:
    service, client = await start_formatter(
        nats_url, subjects, idle_timeout_s=30.0, shutdown_grace_s=1.0
    )
    try:
        yield service
    finally:
        await service.stop()
        await client.drain()


@pytest.fixture
async def gateway(nc: Client, subjects: Subjects) -> Subscription:
    """What the gateway instance would receive."""
    return await nc.subscribe(subjects.reply_all(GATEWAY_ID))


@pytest.fixture
async def cancels(nc: Client, subjects: Subjects) -> Subscription:
    return await nc.subscribe(subjects.cancel)


async def open_stream(
    nc: Client, subjects: Subjects, *, api: str = "chat", model: str = MODEL, **output: Any
) -> tuple[str, StreamOpened | RequestFailed]:
    request_id = uuid.uuid4().hex
    request = StreamOpen(
        request_id=request_id,
        api=api,  # type: ignore[arg-type]
        model=model,
        reply_to=subjects.reply(GATEWAY_ID, request_id),
        created=int(time.time()),
        prompt_tokens=7,
        output=OutputOptions(**output),
        max_tokens=64,
    )
    reply = await nc.request(subjects.formatter_open, codec.encode(request), timeout=TIMEOUT_S)
    return request_id, codec.decode(reply.data, StreamOpened | RequestFailed)  # type: ignore[arg-type]


async def send_text(
    nc: Client, tokenizer: Any, stream_to: str, request_id: str, texts: list[str], finish: str
) -> None:
    index = 0
    for n, text in enumerate(texts):
        ids = tuple(tokenizer.encode(text, add_special_tokens=False).ids)
        batch = TokenBatch(
            request_id=request_id,
            token_ids=ids,
            index=index,
            finish_reason=finish if n == len(texts) - 1 else None,  # type: ignore[arg-type]
        )
        await nc.publish(stream_to, codec.encode(batch))
        index += len(ids)


async def collect(gateway: Subscription) -> list[ResponseChunk | RequestFailed]:
    """Gateway events until the stream is done or fails."""
    events: list[ResponseChunk | RequestFailed] = []
    while True:
        msg = await gateway.next_msg(timeout=TIMEOUT_S)
        event: GatewayEvent = codec.GATEWAY_EVENTS.decode(msg.data)
        assert not isinstance(event, TensorResult)  # a formatter never sends tensors
        events.append(event)
        if isinstance(event, RequestFailed) or event.done:
            return events


def sse_objects(events: list[ResponseChunk | RequestFailed]) -> list[Any]:
    data = b"".join(e.data for e in events if isinstance(e, ResponseChunk))
    frames = [f.removeprefix(b"data: ") for f in data.split(b"\n\n") if f]
    assert frames[-1] == b"[DONE]"
    return [json.loads(f) for f in frames[:-1]]


async def test_streams_sse_chat_chunks_to_the_gateway(
    nc: Client,
    subjects: Subjects,
    formatter: FormatterService,
    gateway: Subscription,
    tokenizer: Any,
) -> None:
    request_id, opened = await open_stream(nc, subjects, stream=True, include_usage=True)
    assert isinstance(opened, StreamOpened)
    assert opened.stream_to == subjects.stream("f1", request_id)
    await send_text(
        nc, tokenizer, opened.stream_to, request_id, ["Hello", " wörld", " 🙂"], "length"
    )
    events = await collect(gateway)
    objects = sse_objects(events)
    content = "".join(o["choices"][0]["delta"].get("content", "") for o in objects if o["choices"])
    assert content == "Hello wörld 🙂"
    usage = objects[-1]["usage"]
    assert usage["prompt_tokens"] == 7
    assert formatter.in_flight == 0
    # The done chunk carries the counts for the gateway's access line; the others do not.
    last = events[-1]
    assert isinstance(last, ResponseChunk)
    assert (last.done, last.prompt_tokens, last.completion_tokens, last.finish_reason) == (
        True,
        7,
        usage["completion_tokens"],
        "length",
    )
    assert all(e.completion_tokens == 0 for e in events[:-1] if isinstance(e, ResponseChunk))


async def test_non_streaming_completion_is_one_json_body(
    nc: Client,
    subjects: Subjects,
    formatter: FormatterService,
    gateway: Subscription,
    tokenizer: Any,
) -> None:
    request_id, opened = await open_stream(nc, subjects, api="completion")
    assert isinstance(opened, StreamOpened)
    await send_text(nc, tokenizer, opened.stream_to, request_id, ["Hello", " world"], "stop")
    [event] = await collect(gateway)
    assert isinstance(event, ResponseChunk)
    assert json.loads(event.data)["choices"][0]["text"] == "Hello world"


async def test_stop_string_truncates_and_publishes_cancel(
    nc: Client,
    subjects: Subjects,
    formatter: FormatterService,
    gateway: Subscription,
    cancels: Subscription,
    tokenizer: Any,
) -> None:
    request_id, opened = await open_stream(nc, subjects, stream=True, stop=("STOP",))
    assert isinstance(opened, StreamOpened)
    texts = ["Go go", " ST", "OP now", " more"]
    await send_text(nc, tokenizer, opened.stream_to, request_id, texts, "length")
    objects = sse_objects(await collect(gateway))
    content = "".join(o["choices"][0]["delta"].get("content", "") for o in objects)
    assert (content, objects[-1]["choices"][0]["finish_reason"]) == ("Go go ", "stop")
    cancel = codec.decode((await cancels.next_msg(timeout=TIMEOUT_S)).data, Cancel)
    assert (cancel.request_id, cancel.reason) == (request_id, "stop_string")


async def test_worker_failure_is_forwarded_as_is(
    nc: Client, subjects: Subjects, formatter: FormatterService, gateway: Subscription
) -> None:
    request_id, opened = await open_stream(nc, subjects)
    assert isinstance(opened, StreamOpened)
    failed = RequestFailed(
        request_id=request_id, code="no_worker_available", message="x", status=503
    )
    await nc.publish(opened.stream_to, codec.encode(failed))
    assert await collect(gateway) == [failed]


async def test_unknown_model_fails_the_handshake(
    nc: Client, subjects: Subjects, formatter: FormatterService
) -> None:
    _, reply = await open_stream(nc, subjects, model="no/such-model")
    assert isinstance(reply, RequestFailed)
    assert (reply.status, reply.code) == (404, "model_not_found")


async def test_gateway_cancel_drops_the_request(
    nc: Client, subjects: Subjects, formatter: FormatterService
) -> None:
    request_id, opened = await open_stream(nc, subjects, stream=True)
    assert isinstance(opened, StreamOpened)
    assert formatter.in_flight == 1
    await nc.publish(subjects.cancel, codec.encode(Cancel(request_id=request_id)))
    await eventually_async(
        lambda: formatter.in_flight == 0,
        timeout_s=TIMEOUT_S,
        message="the cancelled request is still in flight",
    )


async def test_idle_request_times_out_with_504_and_cancel(
    nats_url: str,
    nc: Client,
    subjects: Subjects,
    published: None,
    gateway: Subscription,
    cancels: Subscription,
) -> None:
    service, client = await start_formatter(nats_url, subjects, idle_timeout_s=0.3)
    try:
        request_id, opened = await open_stream(nc, subjects, stream=True)
        assert isinstance(opened, StreamOpened)
        [event] = await collect(gateway)
        cancel = codec.decode((await cancels.next_msg(timeout=TIMEOUT_S)).data, Cancel)
    finally:
        await service.stop()
        await client.drain()
    assert isinstance(event, RequestFailed)
    assert (event.status, event.code) == (504, "timeout")
    assert (cancel.request_id, cancel.reason) == (request_id, "timeout")


async def test_shutdown_waits_for_in_flight_streams(
    nats_url: str,
    nc: Client,
    subjects: Subjects,
    published: None,
    gateway: Subscription,
    tokenizer: Any,
) -> None:
    service, client = await start_formatter(nats_url, subjects, shutdown_grace_s=5.0)
    request_id, opened = await open_stream(nc, subjects, stream=True)
    assert isinstance(opened, StreamOpened)
    stopping = asyncio.create_task(service.stop())
    await send_text(nc, tokenizer, opened.stream_to, request_id, ["Bye"], "stop")
    await asyncio.wait_for(stopping, TIMEOUT_S)
    await client.drain()
    events = await collect(gateway)
    assert isinstance(events[-1], ResponseChunk)
    assert events[-1].done


async def test_text_format_streams_deltas_equal_to_the_openai_text(
    nc: Client,
    subjects: Subjects,
    formatter: FormatterService,
    gateway: Subscription,
    tokenizer: Any,
) -> None:
    texts = ["Hello", " wörld", " 🙂", " STOP", " never"]
    results: dict[str, list[ResponseChunk | RequestFailed]] = {}
    for fmt in ("openai", "text"):
        request_id, opened = await open_stream(
            nc, subjects, stream=True, stop=("STOP",), format=fmt
        )
        assert isinstance(opened, StreamOpened)
        await send_text(nc, tokenizer, opened.stream_to, request_id, texts, "length")
        results[fmt] = await collect(gateway)
    objects = sse_objects(results["openai"])
    openai_text = "".join(o["choices"][0]["delta"].get("content", "") for o in objects)
    chunks = [e for e in results["text"] if isinstance(e, ResponseChunk)]
    assert len(chunks) == len(results["text"])
    assert b"".join(c.data for c in chunks).decode() == openai_text == "Hello wörld 🙂 "
    done, openai_done = chunks[-1], results["openai"][-1]
    assert isinstance(openai_done, ResponseChunk)
    assert (done.done, done.finish_reason, done.prompt_tokens, done.completion_tokens) == (
        True,
        "stop",
        7,
        openai_done.completion_tokens,
    )
    assert all(not c.done and c.data for c in chunks[:-1])


async def test_text_format_non_streaming_is_one_done_chunk(
    nc: Client,
    subjects: Subjects,
    formatter: FormatterService,
    gateway: Subscription,
    tokenizer: Any,
) -> None:
    request_id, opened = await open_stream(nc, subjects, api="completion", format="text")
    assert isinstance(opened, StreamOpened)
    await send_text(nc, tokenizer, opened.stream_to, request_id, ["Hello", " world"], "length")
    [event] = await collect(gateway)
    assert isinstance(event, ResponseChunk)
    assert (event.data, event.done, event.finish_reason, event.completion_tokens) == (
        b"Hello world",
        True,
        "length",
        2,
    )


@pytest.mark.parametrize("stream", [True, False])
async def test_control_characters_never_reach_the_client(
    nc: Client,
    subjects: Subjects,
    formatter: FormatterService,
    gateway: Subscription,
    tokenizer: Any,
    stream: bool,
) -> None:
    request_id, opened = await open_stream(nc, subjects, stream=stream)
    assert isinstance(opened, StreamOpened)
    texts = ["red\x1b[31m alert\x07", "\x00 done\ttab\r\n", "next\x7f \x85x"]
    await send_text(nc, tokenizer, opened.stream_to, request_id, texts, "stop")
    events = await collect(gateway)
    if stream:
        objects = sse_objects(events)
        content = "".join(o["choices"][0]["delta"].get("content", "") for o in objects)
    else:
        [event] = events
        assert isinstance(event, ResponseChunk)
        content = json.loads(event.data)["choices"][0]["message"]["content"]
    assert content == "red[31m alert done\ttab\r\nnext x"
