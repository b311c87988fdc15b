"""``--max-concurrent-requests`` on the real gateway (uvicorn, HTTP + gRPC) against real NATS.

The fake preprocessor+formatter is a real NATS subscriber of the preprocess subject: it answers
each request's first chunk at once and holds the rest until ``release`` is set, so requests stay
in flight as long as a test wants. Clients: the ``openai`` SDK (``max_retries=0``), httpx, and
the generated gRPC stub over ``grpc.aio`` (as ``test_grpc.py``: ``tritonclient`` cannot share a
process with ``shared.kserve``).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import msgspec
import openai
import pytest
from nats.aio.client import Client
from openai.types.chat import ChatCompletionMessageParam

from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc
from shared.kserve_wire import TextResponses, usage_parameters
from shared.messages import ModelCard, Preprocess, ResponseChunk, WorkerCard
from shared.registry import WorkerRegistration, publish_model
from shared.subjects import Subjects
from tests.integration.gateway_support import (
    WAIT_S,
    FakeDownstream,
    Gateway,
    Script,
    Send,
    gateway_config,
    served_gateway,
    until,
    until_live,
)
from tests.support import eventually_awaited

MODEL = "mock-model"
LIMIT = 2
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def _sse(payload: dict[str, object]) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def _chat_chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return _sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [choice],
        }
    )


def _chat_body(content: str) -> bytes:
    message = {"role": "assistant", "content": content}
    return msgspec.json.encode(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
    )


def _replies(request: Preprocess) -> tuple[bytes, bytes]:
    """The first chunk and the last one, in the format the request asked for."""
    if request.output.format == "kserve":
        kserve = request.output.kserve
        assert kserve is not None
        framed = TextResponses(request.model, kserve.id, kserve.outputs)
        return framed.delta(b"Hello"), framed.last("stop", usage_parameters(3, 1))
    if request.output.format == "text":
        return b"", b"Hello"
    if not request.output.stream:
        return b"", _chat_body("Hello")
    return _chat_chunk("Hello"), _chat_chunk(None, "stop") + b"data: [DONE]\n\n"


def holding(release: asyncio.Event) -> Script:
    """A script that streams the first chunk at once and the last once ``release`` is set
    (a request that is not streamed is answered whole, at once)."""

    async def script(request: Preprocess, send: Send) -> None:
        rid = request.request_id
        first, last = _replies(request)
        if request.output.stream:
            await send(ResponseChunk(request_id=rid, data=first))
            await release.wait()
        done = ResponseChunk(
            request_id=rid, data=last, done=True, prompt_tokens=3, completion_tokens=1,
            finish_reason="stop",
        )  # fmt: skip
        await send(done)

    return script


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
async def gateway(nats_url: str, subjects: Subjects) -> AsyncIterator[Gateway]:
    """The real gateway (HTTP + gRPC) with ``--max-concurrent-requests 2``."""
    config = gateway_config(
        nats_url, subjects, WAIT_S, shutdown_grace_s=1.0, max_concurrent_requests=LIMIT
    )
    async with served_gateway(config, serve_grpc=True) as gateway:
        yield gateway


@pytest.fixture
def release() -> asyncio.Event:
    return asyncio.Event()


@pytest.fixture
async def ready(
    gateway: Gateway, nc: Client, subjects: Subjects, tmp_path: Path, release: asyncio.Event
) -> AsyncIterator[FakeDownstream]:
    """A live ``MODEL`` (card + worker card) and the holding downstream; the gateway sees it."""
    await publish_model(
        nc.jetstream(), subjects, ModelCard(model=MODEL, context_length=4096), tmp_path
    )
    registration = WorkerRegistration(
        nc.jetstream(), subjects, WorkerCard(worker_id="w1", model=MODEL)
    )
    await registration.start()
    downstream = FakeDownstream(nc, subjects, holding(release))
    await downstream.start()
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=WAIT_S) as http:
        await until_live(http)
    try:
        yield downstream
    finally:
        release.set()
        # Cancelling a script inside its NATS flush upsets nats-py (a PONG for a cancelled
        # future), and drain then waits: let the released scripts finish first.
        await until(lambda: not downstream._tasks, "the fake downstream's scripts to end")
        await downstream.stop()
        await registration.stop()


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[openai.AsyncOpenAI]:
    api = openai.AsyncOpenAI(
        base_url=f"{gateway.base_url}/v1", api_key="unused", timeout=WAIT_S, max_retries=0
    )
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=WAIT_S) as client:
        yield client


@pytest.fixture
async def stub(gateway: Gateway) -> AsyncIterator[pb_grpc.GRPCInferenceServiceStub]:
    async with grpc.aio.insecure_channel(gateway.grpc_target) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


# --- helpers -------------------------------------------------------------------------------------


async def _metric(http: httpx.AsyncClient, name: str) -> float:
    for row in (await http.get("/metrics")).text.splitlines():
        key, _, value = row.rpartition(" ")
        if key == name:
            return float(value)
    raise AssertionError(f"{name} not in /metrics")


async def _until_in_flight(http: httpx.AsyncClient, n: int) -> None:
    async def holds() -> bool:
        return await _metric(http, "jetserve_gateway_concurrent_requests") == n

    await eventually_awaited(holds, timeout_s=WAIT_S, message=f"never {n} requests in flight")


async def _hold_every_slot(client: openai.AsyncOpenAI) -> tuple[list[Any], list[Any]]:
    """``LIMIT`` streams in flight, each past its first chunk: (their readers, those chunks)."""
    streams = [
        await client.chat.completions.create(model=MODEL, messages=CHAT, stream=True)
        for _ in range(LIMIT)
    ]
    readers = [stream.__aiter__() for stream in streams]
    firsts = [await reader.__anext__() for reader in readers]
    return readers, firsts


def _infer_request(request_id: str, *, streaming: bool) -> pb.ModelInferRequest:
    """An LLM request as tritonclient builds one (raw contents)."""
    request = pb.ModelInferRequest(model_name=MODEL, id=request_id)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(struct.pack("<I", 2) + b"hi")
    request.inputs.add(name="streaming", datatype="BOOL", shape=[1])
    request.raw_input_contents.append(bytes([streaming]))
    return request


# --- HTTP ----------------------------------------------------------------------------------------


async def test_a_request_over_the_limit_is_503_with_retry_after_then_served_again(
    ready: FakeDownstream,
    client: openai.AsyncOpenAI,
    http: httpx.AsyncClient,
    release: asyncio.Event,
) -> None:
    readers, firsts = await _hold_every_slot(client)
    with pytest.raises(openai.InternalServerError) as refused:
        await client.chat.completions.create(model=MODEL, messages=CHAT, stream=True)
    release.set()
    rests = [[chunk async for chunk in reader] for reader in readers]
    after = await client.chat.completions.create(model=MODEL, messages=CHAT)
    error = refused.value
    assert [f.choices[0].delta.content for f in firsts] == ["Hello", "Hello"]
    assert [r[-1].choices[0].finish_reason for r in rests] == ["stop", "stop"]
    assert (error.status_code, error.code, error.type) == (503, "overloaded", "service_unavailable")
    assert error.response.headers["retry-after"] == "1"
    assert "limit of 2 concurrent requests" in error.message
    assert after.choices[0].message.content == "Hello"
    assert await _metric(http, "jetserve_gateway_concurrent_requests") == 0
    assert await _metric(http, 'jetserve_gateway_rejected_total{reason="overloaded"}') == 1


async def test_embeddings_and_media_share_the_limit(
    ready: FakeDownstream,
    client: openai.AsyncOpenAI,
    http: httpx.AsyncClient,
    release: asyncio.Event,
) -> None:
    readers, _ = await _hold_every_slot(client)
    requests = [
        ("/v1/embeddings", {"model": "an-embedder", "input": "hi"}),
        ("/v1/images/generations", {"model": "a-painter", "prompt": "hi"}),
        ("/v1/videos/generations", {"model": "a-filmmaker", "prompt": "hi"}),
    ]
    refused = [await http.post(path, json=body) for path, body in requests]
    release.set()
    for reader in readers:
        [chunk async for chunk in reader]
    admitted = [await http.post(path, json=body) for path, body in requests]
    for response in refused:
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "overloaded"
        assert response.headers["retry-after"] == "1"
    assert [r.status_code for r in admitted] == [404, 404, 404]  # served: no such model
    assert await _metric(http, "jetserve_gateway_concurrent_requests") == 0


async def test_a_client_that_goes_away_gives_its_slot_back(
    ready: FakeDownstream, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    body = {"model": MODEL, "messages": CHAT, "stream": True}
    first = httpx.AsyncClient(base_url=gateway.base_url, timeout=WAIT_S)
    second = httpx.AsyncClient(base_url=gateway.base_url, timeout=WAIT_S)
    async with first, second, first.stream("POST", "/v1/chat/completions", json=body) as held:
        held_chunks = held.aiter_raw()  # kept: a dropped iterator closes the response
        await held_chunks.__anext__()
        async with second.stream("POST", "/v1/chat/completions", json=body) as gone:
            await gone.aiter_raw().__anext__()
        # Left unread, its connection is closed: the gateway sees the client go.
        await _until_in_flight(http, 1)
        third = await http.post("/v1/chat/completions", json={**body, "stream": False})
    assert third.status_code == 200


# --- gRPC (and both together) --------------------------------------------------------------------


async def test_grpc_and_http_share_the_limit_and_grpc_is_unavailable_over_it(
    ready: FakeDownstream,
    http: httpx.AsyncClient,
    stub: pb_grpc.GRPCInferenceServiceStub,
    release: asyncio.Event,
) -> None:
    body = {"model": MODEL, "messages": CHAT, "stream": True}
    held_stream = stub.ModelStreamInfer(timeout=WAIT_S * 2)
    await held_stream.write(_infer_request("held", streaming=True))
    await asyncio.wait_for(held_stream.read(), WAIT_S)  # one gRPC request in flight
    async with http.stream("POST", "/v1/chat/completions", json=body) as held_http:
        held_chunks = held_http.aiter_raw()  # kept: a dropped iterator closes the response
        await held_chunks.__anext__()  # and one HTTP request: the limit
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await stub.ModelInfer(_infer_request("unary", streaming=False))
        refused_stream = stub.ModelStreamInfer(timeout=WAIT_S)
        await refused_stream.write(_infer_request("streamed", streaming=True))
        stream_error = await asyncio.wait_for(refused_stream.read(), WAIT_S)
        await refused_stream.done_writing()
        refused_http = await http.post("/v1/chat/completions", json=body)
        release.set()
    await held_stream.done_writing()
    held_rest = []
    while (response := await asyncio.wait_for(held_stream.read(), WAIT_S)) != grpc.aio.EOF:
        held_rest.append(response)
    after = await stub.ModelInfer(_infer_request("after", streaming=False))
    trailers = dict(unary.value.trailing_metadata() or ())
    assert unary.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "limit of 2 concurrent requests" in (unary.value.details() or "")
    assert trailers["retry-after"] == "1"
    assert "limit of 2 concurrent requests" in stream_error.error_message
    assert refused_http.status_code == 503
    assert not any(r.error_message for r in held_rest)
    assert after.id == "after"
    assert await _metric(http, "jetserve_gateway_concurrent_requests") == 0
    assert await _metric(http, 'jetserve_gateway_rejected_total{reason="overloaded"}') == 3
