"""The gateway in-process (uvicorn) against real NATS, with a fake preprocessor+formatter.

The fake downstream is raw nats-py: it takes ``Preprocess`` from ``subjects.preprocess`` and
answers on its ``reply_to`` with ``ResponseChunk``/``RequestFailed``, as the real pipeline does.
Clients are the real ``openai.AsyncOpenAI`` SDK and httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import openai
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from shared import codec
from shared.messages import (
    Cancel,
    ModelCard,
    Preprocess,
    RequestFailed,
    ResponseChunk,
    WorkerCard,
)
from shared.registry import WorkerRegistration, publish_model
from shared.subjects import Subjects
from tests.integration.gateway_support import (
    WAIT_S,
    FakeDownstream,
    Gateway,
    Send,
    gateway_config,
    served_gateway,
    until,
    until_live,
)
from tests.support import eventually_awaited, free_port

MODEL = "mock-model"
REQUEST_TIMEOUT_S = 1.0
HANG_S = 30.0
"""A wait only a hang runs into."""


# --- fakes and fixtures --------------------------------------------------------------------------


def sse(payload: dict[str, object]) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def chat_chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def chat_body(content: str) -> bytes:
    return msgspec.json.encode(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
    )


def completion_chunk(text: str, finish: str | None = None) -> bytes:
    return sse(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
        }
    )


async def _hello_world(request: Preprocess, send: Send) -> None:
    rid = request.request_id
    if request.api == "completion":
        frames = [
            completion_chunk("Hello"),
            completion_chunk(" world", "stop") + b"data: [DONE]\n\n",
        ]
    else:
        frames = [chat_chunk("Hello"), chat_chunk(" world", "stop") + b"data: [DONE]\n\n"]
    if not request.output.stream:
        body = chat_body("Hello world")
        await send(
            ResponseChunk(
                request_id=rid, data=body, done=True, prompt_tokens=3, completion_tokens=2
            )
        )
        return
    for i, frame in enumerate(frames):
        await send(ResponseChunk(request_id=rid, data=frame, done=i == len(frames) - 1))


@pytest.fixture
async def gateway(nats_url: str, subjects: Subjects) -> AsyncIterator[Gateway]:
    """The real gateway app under uvicorn (httptools) on a free port, in this event loop."""
    config = gateway_config(nats_url, subjects, REQUEST_TIMEOUT_S)
    async with served_gateway(config) as gateway:
        yield gateway


@pytest.fixture
async def model_card(nc: Client, subjects: Subjects, tmp_path: Path) -> None:
    """``MODEL`` is known: its card is in the models object store."""
    await publish_model(
        nc.jetstream(), subjects, ModelCard(model=MODEL, context_length=4096), tmp_path
    )


@pytest.fixture
async def worker(nc: Client, subjects: Subjects, model_card: None) -> AsyncIterator[None]:
    """One live worker card for ``MODEL`` in the workers bucket."""
    registration = WorkerRegistration(
        nc.jetstream(), subjects, WorkerCard(worker_id="w1", model=MODEL)
    )
    await registration.start()
    try:
        yield
    finally:
        await registration.stop()


@pytest.fixture
async def downstream(nc: Client, subjects: Subjects) -> AsyncIterator[FakeDownstream]:
    fake = FakeDownstream(nc, subjects, _hello_world)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=WAIT_S) as client:
        yield client


@pytest.fixture
async def ready(
    gateway: Gateway, worker: None, downstream: FakeDownstream, http: httpx.AsyncClient
) -> FakeDownstream:
    """A gateway that sees a live model, with the fake downstream answering."""
    await until_live(http)
    return downstream


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
async def cancels(nc: Client, subjects: Subjects) -> asyncio.Queue[Cancel]:
    """Every ``Cancel`` broadcast in this namespace."""
    queue: asyncio.Queue[Cancel] = asyncio.Queue()

    async def on_cancel(msg: Msg) -> None:
        queue.put_nowait(codec.decode(msg.data, Cancel))

    await nc.subscribe(subjects.cancel, cb=on_cancel)
    await nc.flush()
    return queue


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def error_of(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, object] = body["error"]
    return error


# --- happy paths ---------------------------------------------------------------------------------


async def test_streamed_chat_reaches_the_openai_client_chunk_by_chunk(
    ready: FakeDownstream, client: openai.AsyncOpenAI
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello world"
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_non_streamed_chat_returns_the_formatters_json_body(
    ready: FakeDownstream, client: openai.AsyncOpenAI
) -> None:
    completion = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    assert completion.choices[0].message.content == "Hello world"
    assert completion.usage is not None
    assert completion.usage.total_tokens == 5


async def test_one_access_line_per_request_with_the_token_counts(
    ready: FakeDownstream, http: httpx.AsyncClient
) -> None:
    with capture_logs(processors=[merge_contextvars]) as logs:
        response = await http.post("/v1/chat/completions", json=CHAT)
        await http.get("/health")
    lines = [line for line in logs if line["event"] == "request_finished"]
    assert [line["log_level"] for line in lines] == ["info", "debug"]
    access = lines[0]
    assert {k: access[k] for k in ("method", "path", "model", "status", "request_id")} == {
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": MODEL,
        "status": 200,
        "request_id": response.headers["x-request-id"],
    }
    assert (access["prompt_tokens"], access["completion_tokens"]) == (3, 2)
    assert 0 < access["ttft_ms"] <= access["duration_ms"]
    assert "error" not in access


async def test_openapi_json_describes_the_inference_endpoints(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    response = await http.get("/openapi.json")
    paths = response.json()["paths"]
    assert response.status_code == 200
    assert {"/v1/chat/completions", "/v1/completions"} <= set(paths)


async def test_streamed_completion_reaches_the_openai_client(
    ready: FakeDownstream, client: openai.AsyncOpenAI
) -> None:
    stream = await client.completions.create(model=MODEL, prompt="Say", max_tokens=4, stream=True)
    assert "".join([c.choices[0].text async for c in stream]) == "Hello world"


async def test_streamed_bytes_pass_through_unchanged_with_sse_headers(
    ready: FakeDownstream, http: httpx.AsyncClient
) -> None:
    response = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    expected = chat_chunk("Hello") + chat_chunk(" world", "stop") + b"data: [DONE]\n\n"
    assert response.content == expected


async def test_preprocess_carries_the_validated_request_and_the_request_id(
    ready: FakeDownstream, http: httpx.AsyncClient, subjects: Subjects
) -> None:
    body = {
        **CHAT,
        "temperature": 0.5,
        "max_completion_tokens": 7,
        "stop": "END",
        "stream": True,
        "stream_options": {"include_usage": True},
        "top_k": 5,
        "ignore_eos": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    response = await http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "abc-1"})
    request = await ready.next_request()
    assert response.headers["x-request-id"] == "abc-1"
    assert (request.request_id, request.api, request.model) == ("abc-1", "chat", MODEL)
    assert request.reply_to == subjects.reply("gw1", "abc-1")
    assert request.messages == ({"role": "user", "content": "hi"},)
    assert request.max_tokens == 7
    assert (request.sampling.temperature, request.sampling.top_k) == (0.5, 5)
    assert request.sampling.ignore_eos
    assert request.output.stop == ("END",)
    assert request.output.include_usage
    assert request.chat_template_kwargs == {"enable_thinking": False}


async def test_invalid_request_id_header_is_replaced_by_a_fresh_one(
    ready: FakeDownstream, http: httpx.AsyncClient
) -> None:
    response = await http.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "a.b"})
    request = await ready.next_request()
    assert response.headers["x-request-id"] == request.request_id != "a.b"


async def test_models_lists_the_model_with_a_live_worker(
    ready: FakeDownstream, client: openai.AsyncOpenAI
) -> None:
    models = [m async for m in client.models.list()]
    assert [(m.id, m.object, m.owned_by) for m in models] == [(MODEL, "model", "jetserve")]
    assert (models[0].model_extra or {})["jetserve"] == {
        "workers": {"prefill": 0, "decode": 0, "both": 1},
        "dp_ranks": 1,
    }


async def test_health_is_ok_once_a_model_is_live(
    ready: FakeDownstream, http: httpx.AsyncClient
) -> None:
    response = await http.get("/health")
    assert response.json() == {"status": "ok", "models": [MODEL]}


async def test_health_is_503_and_live_is_200_without_any_worker(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    health, live = await http.get("/health"), await http.get("/live")
    assert (health.status_code, health.json()["reason"]) == (503, "no_live_model")
    assert live.status_code == 200


async def test_accepted_connections_have_tcp_nodelay(
    ready: FakeDownstream, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """A kept-alive client would otherwise stall ~40 ms on delayed ACKs."""
    await http.get("/live")
    sockets = [
        c.transport.get_extra_info("socket") for c in gateway.server.server_state.connections
    ]
    assert sockets
    assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


# --- request errors ------------------------------------------------------------------------------


async def test_malformed_json_is_400(ready: FakeDownstream, http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert error_of(response)["type"] == "invalid_request_error"


async def test_wrong_field_type_is_400_naming_the_field(
    ready: FakeDownstream, http: httpx.AsyncClient
) -> None:
    response = await http.post("/v1/chat/completions", json={**CHAT, "max_tokens": "many"})
    assert (response.status_code, error_of(response)["param"]) == (400, "max_tokens")


async def test_temperature_out_of_range_is_400_through_the_openai_client(
    ready: FakeDownstream, client: openai.AsyncOpenAI
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=3
        )
    assert caught.value.param == "temperature"


async def test_empty_messages_is_400(ready: FakeDownstream, http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": []})
    assert (response.status_code, error_of(response)["param"]) == (400, "messages")


async def test_unknown_model_is_404(ready: FakeDownstream, client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.code == "model_not_found"


async def test_known_model_without_live_worker_is_503_with_retry_after(
    gateway: Gateway, model_card: None, downstream: FakeDownstream, http: httpx.AsyncClient
) -> None:
    response = await http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert error_of(response)["code"] == "no_worker_available"


async def test_no_preprocessor_running_is_503(
    gateway: Gateway, worker: None, http: httpx.AsyncClient
) -> None:
    await until_live(http)
    response = await http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503
    assert "preprocessor" in str(error_of(response)["message"])
    assert "retry-after" in response.headers


async def test_silent_downstream_is_504_after_the_timeout_and_cancels(
    ready: FakeDownstream, http: httpx.AsyncClient, cancels: asyncio.Queue[Cancel]
) -> None:
    async def silent(request: Preprocess, send: Send) -> None:
        return None

    ready.script = silent
    started = time.monotonic()
    # The client's own timeout only catches a hang: the gateway's answers after 1 s.
    response = await http.post("/v1/chat/completions", json=CHAT, timeout=HANG_S)
    elapsed = time.monotonic() - started
    cancel = await asyncio.wait_for(cancels.get(), HANG_S)
    assert (response.status_code, error_of(response)["code"]) == (504, "timeout")
    assert elapsed >= REQUEST_TIMEOUT_S  # not before the timeout
    assert (cancel.request_id, cancel.reason) == (response.headers["x-request-id"], "timeout")


async def test_early_request_failed_becomes_its_http_status(
    ready: FakeDownstream, http: httpx.AsyncClient
) -> None:
    async def too_long(request: Preprocess, send: Send) -> None:
        failed = RequestFailed(
            request_id=request.request_id,
            code="context_length_exceeded",
            message="too long",
            status=400,
            param="messages",
        )
        await send(failed)

    ready.script = too_long
    response = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 400
    assert error_of(response) == {
        "message": "too long",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
        "param": "messages",
    }


async def test_failure_after_streaming_started_ends_with_error_event_and_done(
    ready: FakeDownstream, http: httpx.AsyncClient
) -> None:
    async def fails_midway(request: Preprocess, send: Send) -> None:
        await send(ResponseChunk(request_id=request.request_id, data=chat_chunk("Hel")))
        await send(RequestFailed(request_id=request.request_id, code="worker_lost", message="gone"))

    ready.script = fails_midway
    response = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    frames = response.content.split(b"\n\n")
    assert response.status_code == 200
    assert msgspec.json.decode(frames[1][len(b"data: ") :])["error"]["code"] == "worker_lost"
    assert frames[2:] == [b"data: [DONE]", b""]


async def test_client_disconnect_mid_stream_publishes_cancel(
    ready: FakeDownstream, http: httpx.AsyncClient, cancels: asyncio.Queue[Cancel]
) -> None:
    async def first_then_hold(request: Preprocess, send: Send) -> None:
        await send(ResponseChunk(request_id=request.request_id, data=chat_chunk("Hel")))
        await ready.release.wait()

    ready.script = first_then_hold
    async with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        first = await asyncio.wait_for(anext(r.aiter_raw()), WAIT_S)
        request_id = r.headers["x-request-id"]
    cancel = await asyncio.wait_for(cancels.get(), WAIT_S)
    assert first.startswith(b"data: ")
    assert (cancel.request_id, cancel.reason) == (request_id, "client_disconnected")


async def test_client_disconnect_before_first_event_publishes_cancel(
    ready: FakeDownstream, gateway: Gateway, cancels: asyncio.Queue[Cancel]
) -> None:
    async def hold(request: Preprocess, send: Send) -> None:
        await ready.release.wait()

    ready.script = hold
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=0.2) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            await impatient.post("/v1/chat/completions", json=CHAT)
    cancel = await asyncio.wait_for(cancels.get(), WAIT_S)
    assert cancel.reason == "client_disconnected"


async def test_unknown_route_is_404_in_openai_shape(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    response = await http.get("/v1/nothing")
    assert (response.status_code, error_of(response)["type"]) == (404, "not_found_error")


async def test_wrong_method_is_405_in_openai_shape(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    response = await http.get("/v1/chat/completions")
    assert (response.status_code, error_of(response)["code"]) == (405, "method_not_allowed")


# --- the real process ----------------------------------------------------------------------------


async def test_sigterm_lets_the_in_flight_stream_finish_then_exits(
    nats_url: str,
    subjects: Subjects,
    worker: None,
    downstream: FakeDownstream,
    tmp_path: Path,
) -> None:
    async def first_then_rest_on_release(request: Preprocess, send: Send) -> None:
        rid = request.request_id
        await send(ResponseChunk(request_id=rid, data=chat_chunk("Hel")))
        await downstream.release.wait()
        await send(ResponseChunk(request_id=rid, data=chat_chunk("lo", "stop"), done=True))

    downstream.script = first_then_rest_on_release
    port = free_port()
    env = {
        "JETSERVE_NATS_URL": nats_url,
        "JETSERVE_NAMESPACE": subjects.namespace,
        "JETSERVE_LOG_FORMAT": "json",
    }
    log_path = tmp_path / "gateway.log"
    proc = _spawn_gateway(port, env, log_path)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT_S) as http:
            await _until_ok_starting(http, "/health", proc, log_path)
            body = {**CHAT, "stream": True}
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                chunks = response.aiter_raw()
                first = await asyncio.wait_for(anext(chunks), WAIT_S)
                proc.send_signal(signal.SIGTERM)
                await until(lambda: "shutdown_started" in _text(log_path), "SIGTERM")
                downstream.release.set()
                rest = b"".join([c async for c in chunks])
        code = await asyncio.wait_for(asyncio.to_thread(proc.wait), WAIT_S * 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first + rest == chat_chunk("Hel") + chat_chunk("lo", "stop")
    assert code == 0, _text(log_path)
    assert "bus_stopped" in _text(log_path)


async def _until_ok_starting(
    http: httpx.AsyncClient, path: str, proc: subprocess.Popen[bytes], log_path: Path
) -> None:
    async def ok() -> bool:
        assert proc.poll() is None, _text(log_path)
        with contextlib.suppress(httpx.TransportError):
            return (await http.get(path)).status_code == 200
        return False

    await eventually_awaited(
        ok,
        timeout_s=WAIT_S * 2,
        interval_s=0.05,
        message=lambda: f"gateway not ready: {_text(log_path)}",
    )


def _spawn_gateway(port: int, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m services.gateway`` in its own session, logging to ``log_path``."""
    with log_path.open("wb") as log_file:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.gateway",
                "--http-port",
                str(port),
                # Its own gRPC port: the default (8001) may be taken on this machine.
                "--grpc-port",
                str(free_port()),
            ],
            env={**os.environ, **env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _text(path: Path) -> str:
    return path.read_text()


async def test_a_reused_request_id_goes_out_under_a_fresh_bus_id(
    ready: FakeDownstream, http: httpx.AsyncClient
) -> None:
    """Services remember finished ids (decision 013): a client reusing its ``X-Request-Id``
    used to meet that memory and wait ~2 s for a resubmit (found by the fuzz run)."""
    first = await http.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "same"})
    sent_first = await ready.next_request()
    second = await http.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "same"})
    sent_second = await ready.next_request()
    assert first.headers["x-request-id"] == second.headers["x-request-id"] == "same"
    assert sent_first.request_id == "same"
    assert sent_second.request_id.startswith("same-")
    assert sent_second.reply_to.endswith(sent_second.request_id)
