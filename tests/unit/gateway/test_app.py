"""The Litestar app with a hand-written fake bus (in memory, no sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from services.gateway.app import create_app
from services.gateway.bus import Inbox, Reply, ReplyItem
from services.gateway.config import GatewayConfig
from services.gateway.routes import Readiness
from shared.messages import ModelCard, Preprocess, ResponseChunk

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class FakeBus:
    """Answers every request with ``script``; records what the app asked for."""

    def __init__(self) -> None:
        self.script: list[ReplyItem] = []
        self.check_error: Exception | None = None
        self.started = self.stopped = False
        self.submitted: list[Preprocess] = []
        self.cancelled: list[tuple[str, str]] = []
        self.is_connected = True
        self.in_flight = 0

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def live_models(self) -> list[str]:
        return ["m"]

    async def check_model(self, model: str) -> None:
        if self.check_error is not None:
            raise self.check_error

    async def model_card(self, model: str) -> ModelCard | None:
        return ModelCard(model=model, context_length=8, created=123)

    def reply_subject(self, request_id: str) -> str:
        return f"gw.{request_id}"

    async def submit(self, request: Preprocess) -> Reply:
        self.submitted.append(request)
        inbox = Inbox()
        for item in self.script:
            inbox.put_nowait(item)
        return Reply(self, request.request_id, inbox)  # type: ignore[arg-type]

    def forget(self, request_id: str) -> None:
        pass

    def cancel_soon(self, request_id: str, reason: str) -> None:
        self.cancelled.append((request_id, reason))


@pytest.fixture
def bus() -> FakeBus:
    return FakeBus()


@pytest.fixture
def readiness() -> Readiness:
    return Readiness()


@pytest.fixture
async def http(bus: FakeBus, readiness: Readiness) -> AsyncIterator[AsyncTestClient[Any]]:
    config = GatewayConfig(request_timeout_s=0.2, stream_idle_timeout_s=0.2, gateway_id="gw")
    app = create_app(config, bus=bus, readiness=readiness)  # type: ignore[arg-type]
    async with AsyncTestClient(app) as client:
        yield client


async def test_lifespan_starts_and_stops_the_bus(bus: FakeBus) -> None:
    app = create_app(GatewayConfig(), bus=bus)  # type: ignore[arg-type]
    async with AsyncTestClient(app):
        assert bus.started
    assert bus.stopped


async def test_unexpected_exception_is_a_500_openai_body(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    bus.check_error = RuntimeError("boom")
    response = await http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 500
    assert response.json()["error"] == {
        "message": "Internal server error.",
        "type": "internal_server_error",
        "code": "internal_error",
        "param": None,
    }


async def test_error_responses_carry_the_request_id(http: AsyncTestClient[Any]) -> None:
    response = await http.post("/v1/chat/completions", content=b"{", headers={"X-Request-Id": "r9"})
    assert (response.status_code, response.headers["x-request-id"]) == (400, "r9")


async def test_stream_that_goes_idle_ends_with_timeout_error_and_cancels(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    bus.script = [ResponseChunk(request_id="r1", data=b"data: {}\n\n")]
    response = await http.post(
        "/v1/chat/completions", json={**CHAT, "stream": True}, headers={"X-Request-Id": "r1"}
    )
    frames = response.content.split(b"\n\n")
    assert frames[0] == b"data: {}"
    assert msgspec.json.decode(frames[1][6:])["error"]["code"] == "timeout"
    assert frames[2:] == [b"data: [DONE]", b""]
    assert bus.cancelled == [("r1", "timeout")]


async def test_non_streamed_body_in_several_chunks_is_joined(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    bus.script = [
        ResponseChunk(request_id="r", data=b'{"a":'),
        ResponseChunk(request_id="r", data=b"1}", done=True),
    ]
    response = await http.post("/v1/chat/completions", json=CHAT)
    assert (response.status_code, response.json()) == (200, {"a": 1})


async def test_requests_while_shutting_down_are_503(
    http: AsyncTestClient[Any], readiness: Readiness
) -> None:
    readiness.begin_shutdown()
    chat, health = await http.post("/v1/chat/completions", json=CHAT), await http.get("/health")
    assert (chat.status_code, chat.json()["error"]["code"]) == (503, "shutting_down")
    assert (health.status_code, health.json()["status"]) == (503, "shutting_down")


async def test_models_use_the_model_card_created_time(http: AsyncTestClient[Any]) -> None:
    response = await http.get("/v1/models")
    assert response.json() == {
        "object": "list",
        "data": [{"id": "m", "object": "model", "created": 123, "owned_by": "jetserve"}],
    }
