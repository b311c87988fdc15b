"""The raw-ASGI fast path answers exactly as the Litestar routes do (bytes, logs, metrics).

Each scenario runs twice through ``create_app`` (``fast_path`` on and off) with a scripted
ASGI ``receive`` that behaves like uvicorn's, and the two runs must send the same ASGI
messages, log the same ``request_finished`` fields, count the same metrics and cancel the same
requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from services.gateway.app import create_app
from services.gateway.bus import Reply
from services.gateway.config import GatewayConfig
from services.gateway.errors import DuplicateRequestId
from services.gateway.metrics import GatewayMetrics
from services.gateway.routes import Readiness
from shared.errors import ModelNotFound, NoWorkerAvailable, from_message
from shared.messages import Preprocess, RequestFailed, ResponseChunk
from tests.unit.gateway.test_app import CHAT, FakeBus

CHAT_BODY = msgspec.json.encode(CHAT)
STREAM_BODY = msgspec.json.encode({**CHAT, "stream": True})
COMPLETION_BODY = msgspec.json.encode({"model": "m", "prompt": "hi", "stream": True})
DONE = ResponseChunk(request_id="r", data=b"data: [DONE]\n\n", done=True)
CHUNK = ResponseChunk(request_id="r", data=b'data: {"x":1}\n\n')
FAILED = RequestFailed(
    request_id="r", code="no_worker_available", message="none", status=503, retry_after_s=2.0
)


@dataclass
class Scenario:
    body: list[bytes] | None = None
    """The request body in ``http.request`` messages (None: ``CHAT_BODY`` in one)."""
    path: str = "/v1/chat/completions"
    method: str = "POST"
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    script: list[Any] = field(default_factory=list)
    check_error: Exception | None = None
    submit_error: Exception | None = None
    shutting_down: bool = False
    disconnect_after_s: float | None = None
    disconnect_in_body: bool = False


SCENARIOS = {
    "json": Scenario(script=[ResponseChunk(request_id="r", data=b'{"a":1}', done=True)]),
    "json_in_parts": Scenario(
        script=[
            ResponseChunk(request_id="r", data=b'{"a":'),
            ResponseChunk(request_id="r", data=b"1}", done=True),
        ]
    ),
    "stream": Scenario(body=[STREAM_BODY], script=[CHUNK, CHUNK, DONE]),
    "completion_stream": Scenario(
        path="/v1/completions", body=[COMPLETION_BODY], script=[CHUNK, DONE]
    ),
    "completion_bad": Scenario(path="/v1/completions", body=[b'{"model": "m"}']),
    "body_in_parts": Scenario(body=[STREAM_BODY[:10], STREAM_BODY[10:]], script=[DONE]),
    "stream_fails_midway": Scenario(body=[STREAM_BODY], script=[CHUNK, from_message(FAILED)]),
    "stream_goes_idle": Scenario(body=[STREAM_BODY], script=[CHUNK]),
    "first_event_timeout": Scenario(),
    "early_failure_with_retry_after": Scenario(script=[from_message(FAILED)]),
    "invalid_json": Scenario(body=[b"{"], headers=[(b"x-request-id", b"mine")]),
    "model_not_found": Scenario(check_error=ModelNotFound("m")),
    "no_worker": Scenario(check_error=NoWorkerAvailable("none", retry_after_s=1.0)),
    "crash": Scenario(check_error=RuntimeError("boom")),
    "duplicate_id": Scenario(submit_error=DuplicateRequestId("dup", param="X-Request-Id")),
    "shutting_down": Scenario(shutting_down=True),
    "too_large_announced": Scenario(headers=[(b"content-length", b"10000001")]),
    "bad_content_length": Scenario(headers=[(b"content-length", b"ten")]),
    "too_large_streamed": Scenario(body=[b" " * 6_000_000, b" " * 6_000_000]),
    "disconnect_in_body": Scenario(body=[b"{"], disconnect_in_body=True),
    "disconnect_before_first": Scenario(disconnect_after_s=0.05),
    "disconnect_mid_stream": Scenario(body=[STREAM_BODY], script=[CHUNK], disconnect_after_s=0.05),
    "wrong_method": Scenario(method="GET"),
    "other_route": Scenario(path="/v1/chat/completion"),
}


class ScriptedBus(FakeBus):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__()
        self.script = list(scenario.script)
        self.check_error = scenario.check_error
        self.submit_error = scenario.submit_error

    async def submit(self, request: Preprocess) -> Reply:
        if self.submit_error is not None:
            raise self.submit_error
        return await super().submit(request)


@dataclass
class Run:
    sent: list[dict[str, Any]]
    finished: list[dict[str, Any]]
    cancelled: list[tuple[str, str]]
    counters: list[str]


async def run(scenario: Scenario, *, fast_path: bool) -> Run:
    config = GatewayConfig(
        request_timeout_s=0.2, stream_idle_timeout_s=0.2, gateway_id="gw", fast_path=fast_path
    )
    bus, readiness, metrics = ScriptedBus(scenario), Readiness(), GatewayMetrics()
    if scenario.shutting_down:
        readiness.begin_shutdown()
    app = create_app(config, bus=bus, readiness=readiness, metrics=metrics)  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()  # uvicorn: disconnected, or the response is complete
    body = [CHAT_BODY] if scenario.body is None else scenario.body
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": part, "more_body": i < len(body) - 1}
        for i, part in enumerate(body)
    ]
    if scenario.disconnect_in_body:
        messages[-1]["more_body"] = True
        messages.append({"type": "http.disconnect"})

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if gone.is_set():
            return  # as uvicorn: nothing reaches a client that has gone
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": scenario.method,
        "scheme": "http",
        "path": scenario.path,
        "raw_path": scenario.path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"test"), *scenario.headers],
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    call: Callable[[], Awaitable[None]] = lambda: app(scope, receive, send)  # type: ignore[arg-type]  # noqa: E731
    with capture_logs() as logs:
        task = asyncio.ensure_future(call())
        if scenario.disconnect_after_s is not None:
            await asyncio.sleep(scenario.disconnect_after_s)
            gone.set()
        await asyncio.wait_for(task, 5)
        await asyncio.sleep(0)
    finished = [
        {k: v for k, v in line.items() if k not in ("latency_ms", "ttft_ms")}
        for line in logs
        if line["event"] == "request_finished"
    ]
    counters = [
        line
        for line in metrics.exposition().decode().splitlines()
        if line.startswith(("jetserve_http_requests_total", "jetserve_errors_total"))
        or "_count{" in line
    ]
    return Run(sent, finished, bus.cancelled, counters)


def _normalize(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Request ids minted per run differ, and the fast path may group body bytes differently
    (queued SSE chunks go out in one message); the start and the body bytes must match."""
    out: list[dict[str, Any]] = []
    for message in sent:
        message = dict(message)
        if message["type"] == "http.response.start":
            message["headers"] = [
                (k, b"<id>" if k == b"x-request-id" and v != b"mine" else v)
                for k, v in message["headers"]
            ]
        elif out and out[-1]["type"] == "http.response.body":
            previous = out.pop()
            message["body"] = previous["body"] + message["body"]
        out.append(message)
    return out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_fast_path_matches_litestar(name: str) -> None:
    scenario = SCENARIOS[name]
    slow = await run(scenario, fast_path=False)
    fast = await run(scenario, fast_path=True)
    assert _normalize(fast.sent) == _normalize(slow.sent)
    assert [{**f, "request_id": None} for f in fast.finished] == [
        {**f, "request_id": None} for f in slow.finished
    ]
    assert [reason for _, reason in fast.cancelled] == [reason for _, reason in slow.cancelled]
    assert fast.counters == slow.counters
    assert slow.sent or slow.finished[0]["status"] == 499


async def test_queued_chunks_go_out_in_one_write_with_the_end() -> None:
    fast = await run(SCENARIOS["stream"], fast_path=True)
    assert [m.get("more_body") for m in fast.sent] == [None, False]
    assert fast.sent[1]["body"] == CHUNK.data + CHUNK.data + DONE.data


async def test_disconnect_mid_stream_cancels_once() -> None:
    fast = await run(SCENARIOS["disconnect_mid_stream"], fast_path=True)
    assert [reason for _, reason in fast.cancelled] == ["client_disconnected"]
    assert fast.finished[0]["error"] == "client_disconnected"
