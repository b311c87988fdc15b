"""``--send-timeout-s`` and ``--body-timeout-s`` on the real gateway (uvicorn, httptools) against
real NATS: clients that stop reading their SSE streams, or never finish sending their bodies,
cannot keep their admission slots.

Each stalled client is a raw socket with a tiny receive buffer that sends a streaming chat request
and never reads; the stand-in downstream answers it with megabytes of tokens, so the gateway's
writes soon wait on the client. Once the send timeout has passed, the gateway must have closed
those connections, freed their slots (other clients are served, not refused) and cancelled their
requests on the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import nats
import pytest
import uvloop
from nats.aio.client import Client
from nats.aio.msg import Msg

from shared import codec
from shared.messages import Cancel, ModelCard, Preprocess, ResponseChunk, WorkerCard
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
LIMIT = 3
"""Slots; as many stalled clients as slots, one connection each (a share of 1 slot each)."""
SEND_TIMEOUT_S = 1.0
TOKEN = "x" * 32_000
CHUNKS = 128
"""About 4 MB per streamed answer: far more than the socket buffers of a client that does not
read, and under ``--max-buffered-bytes-per-request`` (8 MB), so only the send timeout ends it."""


def _sse(payload: dict[str, object]) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def _chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return _sse({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                 "choices": [choice]})  # fmt: skip


def _body(content: str) -> bytes:
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return msgspec.json.encode(
        {"id": "c1", "object": "chat.completion", "created": 0, "model": MODEL,
         "choices": [choice]}
    )  # fmt: skip


def long_answers(release: asyncio.Event) -> Script:
    """A streamed request gets ``CHUNKS`` big chunks at once, then its end once ``release`` is
    set (the worker is still generating meanwhile); one not streamed, a short body at once."""

    async def script(request: Preprocess, send: Send) -> None:
        rid = request.request_id
        if request.output.stream:
            for _ in range(CHUNKS):
                await send(ResponseChunk(request_id=rid, data=_chunk(TOKEN)))
            await release.wait()
            last = _chunk(None, "stop") + b"data: [DONE]\n\n"
        else:
            last = _body("Hello")
        done = ResponseChunk(
            request_id=rid, data=last, done=True, prompt_tokens=3, completion_tokens=1,
            finish_reason="stop",
        )  # fmt: skip
        await send(done)

    return script


@contextlib.asynccontextmanager
async def serving(
    nats_url: str, subjects: Subjects, nc: Client, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, FakeDownstream]]:
    """The real gateway (``--max-concurrent-requests 3``, ``--send-timeout-s 1``) and a live
    ``MODEL`` answered by ``long_answers``, once the gateway sees it."""
    config = gateway_config(
        nats_url,
        subjects,
        WAIT_S,
        shutdown_grace_s=1.0,
        max_concurrent_requests=LIMIT,
        send_timeout_s=SEND_TIMEOUT_S,
        body_timeout_s=SEND_TIMEOUT_S,
    )
    await publish_model(
        nc.jetstream(), subjects, ModelCard(model=MODEL, context_length=4096), tmp_path
    )
    registration = WorkerRegistration(
        nc.jetstream(), subjects, WorkerCard(worker_id="w1", model=MODEL)
    )
    await registration.start()
    release = asyncio.Event()
    fake = FakeDownstream(nc, subjects, long_answers(release))
    await fake.start()
    try:
        async with served_gateway(config) as gateway:
            async with httpx.AsyncClient(base_url=gateway.base_url, timeout=WAIT_S) as http:
                await until_live(http)
            try:
                yield gateway, fake
            finally:
                release.set()
                await until(lambda: not fake._tasks, "the downstream's scripts to end", WAIT_S * 2)
    finally:
        await fake.stop()
        await registration.stop()


async def _stalled_client(port: int) -> socket.socket:
    """A connection with a tiny receive buffer that asks for a long stream and never reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    body = msgspec.json.encode(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    await loop.sock_sendall(sock, head + body)
    return sock


async def _closed_by_server(sock: socket.socket) -> bool:
    """Read what is left until the server closes (EOF or reset): True; False when it keeps the
    connection open past ``WAIT_S``."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            data = await asyncio.wait_for(loop.sock_recv(sock, 65536), WAIT_S)
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        if not data:
            return True
    return False


async def _metric(http: httpx.AsyncClient, name: str) -> float:
    for row in (await http.get("/metrics")).text.splitlines():
        key, _, value = row.rpartition(" ")
        if key == name:
            return float(value)
    raise AssertionError(f"{name} not in /metrics")


async def _until_in_flight(http: httpx.AsyncClient, slots: int, what: str) -> None:
    """Poll ``jetserve_gateway_concurrent_requests`` until it is ``slots`` (``what`` fails)."""

    async def holds() -> bool:
        return await _metric(http, "jetserve_gateway_concurrent_requests") == slots

    await eventually_awaited(holds, timeout_s=WAIT_S, message=what)


async def test_clients_that_stop_reading_lose_their_slots_and_connections(
    nats_url: str,
    subjects: Subjects,
    nc: Client,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await _stop_reading_scenario(nats_url, subjects, nc, tmp_path)
    _assert_no_uvicorn_errors(caplog)


def test_the_same_on_uvloop(
    nats_url: str, subjects: Subjects, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway serves on uvloop, whose transports pause, resume and abort on their own."""

    async def scenario() -> None:
        nc = await nats.connect(nats_url)
        try:
            await _stop_reading_scenario(nats_url, subjects, nc, tmp_path)
        finally:
            await nc.drain()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())
    _assert_no_uvicorn_errors(caplog)


def _assert_no_uvicorn_errors(caplog: pytest.LogCaptureFixture) -> None:
    """An abandoned response ends as a disconnect: uvicorn logs no "returned without completing
    response" (nor any other error)."""
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("uvicorn") and r.levelno >= logging.ERROR
    ]
    assert errors == []


async def _stop_reading_scenario(
    nats_url: str, subjects: Subjects, nc: Client, tmp_path: Path
) -> None:
    """``LIMIT`` clients stop reading their streams: once the send timeout has passed, others
    are served again (200, not 503), the stalled connections are closed by the gateway, no slot
    is held, and the stalled requests are cancelled on the bus as a disconnect is."""
    cancels: list[Cancel] = []

    async def on_cancel(msg: Msg) -> None:
        cancels.append(codec.decode(msg.data, Cancel))

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    await nc.subscribe(subjects.cancel, cb=on_cancel)
    async with (
        serving(nats_url, subjects, nc, tmp_path) as (gateway, downstream),
        httpx.AsyncClient(base_url=gateway.base_url, timeout=WAIT_S) as http,
    ):
        stalled = [await _stalled_client(gateway.config.http_port) for _ in range(LIMIT)]
        try:
            stalled_ids = {(await downstream.next_request()).request_id for _ in range(LIMIT)}
            # Every slot is held by a stalled stream until the send timeout frees them.
            statuses: list[int] = []

            async def served() -> bool:
                statuses.append((await http.post("/v1/chat/completions", json=chat)).status_code)
                return statuses[-1] == 200

            await eventually_awaited(
                served,
                timeout_s=SEND_TIMEOUT_S + WAIT_S,
                interval_s=0.05,
                message=lambda: f"never served again: {statuses[-5:]}",
            )
            served_after = [
                (await http.post("/v1/chat/completions", json=chat)).status_code
                for _ in range(LIMIT + 1)
            ]
            closed = [await _closed_by_server(sock) for sock in stalled]
        finally:
            for sock in stalled:
                sock.close()
        await _until_in_flight(http, 0, "slots still held")
        timeouts = await _metric(
            http, 'jetserve_errors_total{code="send_timeout",service="gateway"}'
        )
        await until(lambda: stalled_ids <= {c.request_id for c in cancels}, "their cancels")
    assert set(statuses) <= {200, 503}
    assert served_after == [200] * (LIMIT + 1)
    assert closed == [True] * LIMIT
    assert timeouts == LIMIT
    reasons = {c.request_id: c.reason for c in cancels if c.request_id in stalled_ids}
    assert reasons == dict.fromkeys(stalled_ids, "client_disconnected")


async def _withholding_client(port: int) -> socket.socket:
    """A connection that announces a body and sends a tenth of it, then nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n"
    )
    await loop.sock_sendall(sock, head + b'{"model": ' + b" " * 90)
    return sock


async def test_clients_that_withhold_their_bodies_lose_their_slots_and_connections(
    nats_url: str, subjects: Subjects, nc: Client, tmp_path: Path
) -> None:
    """``LIMIT`` clients send headers and part of a body: once the body timeout has passed,
    their connections are closed, their slots free, and others are served."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with (
        serving(nats_url, subjects, nc, tmp_path) as (gateway, _),
        httpx.AsyncClient(base_url=gateway.base_url, timeout=WAIT_S) as http,
    ):
        held = [await _withholding_client(gateway.config.http_port) for _ in range(LIMIT)]
        try:
            await _until_in_flight(http, LIMIT, "the withheld bodies never took their slots")
            closed = [await _closed_by_server(sock) for sock in held]
        finally:
            for sock in held:
                sock.close()
        await _until_in_flight(http, 0, "slots still held")
        served = [
            (await http.post("/v1/chat/completions", json=chat)).status_code
            for _ in range(LIMIT + 1)
        ]
        timeouts = await _metric(
            http, 'jetserve_errors_total{code="body_timeout",service="gateway"}'
        )
    assert closed == [True] * LIMIT
    assert served == [200] * (LIMIT + 1)
    assert timeouts == LIMIT
