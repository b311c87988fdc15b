"""The inference path (``Relay`` behind ``Gateway``), driven as uvicorn drives an ASGI app.

Each test sends one request through ``create_app`` with a scripted ``receive`` and a fake bus,
and checks the exact ASGI messages sent back (status, headers in order, body bytes), the access
line, the metrics and the ``Cancel``s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from services.gateway.config import GatewayConfig
from services.gateway.core.errors import DuplicateRequestId
from services.gateway.core.metrics import GatewayMetrics
from services.gateway.core.readiness import Readiness
from services.gateway.http.app import create_app
from shared.errors import ModelNotFound, NoWorkerAvailable, from_message
from shared.messages import RequestFailed, ResponseChunk
from tests.unit.gateway.fakes import CHAT, FakeBus

CHAT_BODY = msgspec.json.encode(CHAT)
STREAM_BODY = msgspec.json.encode({**CHAT, "stream": True})
COMPLETION_BODY = msgspec.json.encode({"model": "m", "prompt": "hi", "stream": True})
CHUNK = ResponseChunk(request_id="r1", data=b'data: {"x":1}\n\n')
DONE = ResponseChunk(
    request_id="r1", data=b"data: [DONE]\n\n", done=True, prompt_tokens=3, completion_tokens=2
)
JSON_DONE = ResponseChunk(
    request_id="r1", data=b'{"a":1}', done=True, prompt_tokens=3, completion_tokens=2
)
FAILED = RequestFailed(
    request_id="r1", code="no_worker_available", message="none", status=503, retry_after_s=2.0
)
ID = (b"x-request-id", b"r1")
JSON = (b"content-type", b"application/json")
SSE = [
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
    ID,
]
TIMEOUT_BODY = (
    b'{"error":{"message":"No response from upstream within 0.2s.",'
    b'"type":"timeout","code":"timeout","param":null}}'
)
NO_WORKER_BODY = (
    b'{"error":{"message":"none","type":"service_unavailable",'
    b'"code":"no_worker_available","param":null}}'
)
TOO_LARGE_BODY = (
    b'{"error":{"message":"Request Entity Too Large","type":"invalid_request_error",'
    b'"code":"invalid_request","param":null}}'
)


@dataclass
class Exchange:
    sent: list[dict[str, Any]]
    access: MutableMapping[str, Any]
    """The request's one ``request_finished`` line."""
    logs: list[MutableMapping[str, Any]]
    bus: FakeBus
    metrics: GatewayMetrics


async def exchange(
    body: Sequence[bytes] = (CHAT_BODY,),
    *,
    path: str = "/v1/chat/completions",
    method: str = "POST",
    headers: Sequence[tuple[bytes, bytes]] = (ID,),
    script: Sequence[Any] = (),
    bus: FakeBus | None = None,
    readiness: Readiness | None = None,
    disconnect_in_body: bool = False,
    client: Callable[[FakeBus, asyncio.Event], Awaitable[None]] | None = None,
    config: GatewayConfig | None = None,
) -> Exchange:
    """One request through the app; ``client`` runs beside it (late replies, a disconnect)."""
    config = config or GatewayConfig(
        request_timeout_s=0.2, stream_idle_timeout_s=0.2, gateway_id="gw"
    )
    bus = bus or FakeBus()
    bus.script = list(script)
    metrics = GatewayMetrics()
    app = create_app(config, bus=bus, readiness=readiness, metrics=metrics)
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()  # as uvicorn: the client disconnected, or the response is complete
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": part, "more_body": i < len(body) - 1}
        for i, part in enumerate(body)
    ]
    if disconnect_in_body:
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
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"test"), *headers],
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    with capture_logs(processors=[merge_contextvars]) as logs:
        task = asyncio.ensure_future(app(scope, receive, send))  # type: ignore[arg-type]
        if client is not None:
            await client(bus, gone)
        await asyncio.wait_for(task, 5)
    access = [line for line in logs if line["event"] == "request_finished"]
    assert len(access) == 1, access
    return Exchange(sent, access[0], logs, bus, metrics)


def start(status: int, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http.response.start", "status": status, "headers": headers}


def body(data: bytes, *, more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


def error_response(status: int, data: bytes, *extra: tuple[bytes, bytes]) -> list[dict[str, Any]]:
    """An error answer as ``Relay`` sends it: extra headers first, then the fixed ones."""
    length = (b"content-length", b"%d" % len(data))
    return [start(status, [*extra, JSON, length, ID]), body(data)]


def error_of(exchanged: Exchange) -> dict[str, Any]:
    error: dict[str, Any] = msgspec.json.decode(exchanged.sent[1]["body"])["error"]
    return error


# --- answers -------------------------------------------------------------------------------------


async def test_json_answer_and_its_access_line() -> None:
    done = await exchange(script=[JSON_DONE])
    length = (b"content-length", b"7")
    assert done.sent == [start(200, [JSON, length, ID]), body(b'{"a":1}')]
    access = done.access
    assert access["log_level"] == "info"
    assert {k: v for k, v in access.items() if k not in ("ttft_ms", "duration_ms")} == {
        "event": "request_finished",
        "log_level": "info",
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "m",
        "status": 200,
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "request_id": "r1",
    }
    assert 0 <= access["ttft_ms"] <= access["duration_ms"]
    assert done.bus.cancelled == []


async def test_json_answer_in_parts_is_joined_and_counts_the_last_parts_tokens() -> None:
    parts = [ResponseChunk(request_id="r1", data=b'{"a":'), JSON_DONE]
    done = await exchange(script=parts)
    assert done.sent[1] == body(b'{"a":{"a":1}')
    assert (done.access["prompt_tokens"], done.access["completion_tokens"]) == (3, 2)


async def test_queued_sse_chunks_go_out_in_one_write_with_the_end() -> None:
    done = await exchange([STREAM_BODY], script=[CHUNK, CHUNK, DONE])
    assert done.sent == [start(200, SSE), body(CHUNK.data + CHUNK.data + DONE.data)]
    assert (done.access["status"], done.access["completion_tokens"]) == (200, 2)
    assert "error" not in done.access


async def test_sse_chunks_arriving_apart_are_flushed_as_they_come() -> None:
    async def trickle(bus: FakeBus, gone: asyncio.Event) -> None:
        await asyncio.sleep(0.02)
        bus.inboxes[0].put_nowait(CHUNK)
        await asyncio.sleep(0.02)
        bus.inboxes[0].put_nowait(DONE)

    done = await exchange([STREAM_BODY], script=[CHUNK], client=trickle)
    assert done.sent == [
        start(200, SSE),
        body(CHUNK.data, more=True),
        body(CHUNK.data, more=True),
        body(DONE.data),
    ]


KEEP_ALIVE = GatewayConfig(
    request_timeout_s=5, stream_idle_timeout_s=5, gateway_id="gw", sse_keep_alive_s=0.01
)


async def test_an_idle_stream_gets_keep_alive_comments_between_chunks() -> None:
    async def slow(bus: FakeBus, gone: asyncio.Event) -> None:
        await asyncio.sleep(0.2)  # 20 keep-alive intervals: their timers fire first
        bus.inboxes[0].put_nowait(DONE)

    done = await exchange([STREAM_BODY], script=[CHUNK], client=slow, config=KEEP_ALIVE)
    assert done.sent[:2] == [start(200, SSE), body(CHUNK.data, more=True)]
    assert done.sent[-1] == body(DONE.data)
    middle = done.sent[2:-1]
    assert middle  # at least one keep-alive, and nothing else between the chunks
    assert all(m == body(b": keep-alive\n\n", more=True) for m in middle)


async def test_keep_alives_do_not_extend_the_idle_limit() -> None:
    config = GatewayConfig(
        request_timeout_s=5, stream_idle_timeout_s=0.1, gateway_id="gw", sse_keep_alive_s=0.02
    )
    done = await exchange([STREAM_BODY], script=[CHUNK], config=config)
    assert done.sent[-1]["body"].startswith(b'data: {"error"')
    assert (done.access["error"], done.bus.cancelled) == ("timeout", [("r1", "timeout")])


async def test_a_json_answer_gets_no_keep_alive() -> None:
    async def slow(bus: FakeBus, gone: asyncio.Event) -> None:
        await asyncio.sleep(0.1)
        bus.inboxes[0].put_nowait(JSON_DONE)

    chunk = ResponseChunk(request_id="r1", data=b'{"a":')
    done = await exchange(script=[chunk], client=slow, config=KEEP_ALIVE)
    assert [m["type"] for m in done.sent] == ["http.response.start", "http.response.body"]
    assert done.sent[1]["body"] == b'{"a":{"a":1}'


async def test_completion_stream_in_a_body_read_in_parts() -> None:
    done = await exchange(
        [COMPLETION_BODY[:10], COMPLETION_BODY[10:]], path="/v1/completions", script=[DONE]
    )
    assert done.sent == [start(200, SSE), body(DONE.data)]
    assert done.bus.submitted[0].api == "completion"
    assert done.access["path"] == "/v1/completions"


async def test_a_fresh_request_id_is_minted_and_sent_back() -> None:
    done = await exchange(headers=[], script=[JSON_DONE])
    request_id = done.bus.submitted[0].request_id
    assert done.sent[0]["headers"][-1] == (b"x-request-id", request_id.encode())
    assert done.access["request_id"] == request_id
    assert done.bus.submitted[0].reply_to == f"gw.{request_id}"


# --- failures before the headers: their real status ----------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param(
            {"body": [b"{"]},
            error_response(
                400,
                b'{"error":{"message":"The request body is not valid JSON: Input data was '
                b'truncated","type":"invalid_request_error","code":"invalid_request",'
                b'"param":null}}',
            ),
            id="400-invalid-json",
        ),
        pytest.param(
            {"body": [b'{"model": "m"}'], "path": "/v1/completions"},
            error_response(
                400,
                b'{"error":{"message":"Invalid value for `prompt`: Object missing required field '
                b'`prompt`","type":"invalid_request_error","code":"invalid_request",'
                b'"param":"prompt"}}',
            ),
            id="400-missing-prompt",
        ),
        pytest.param(
            {"headers": [ID, (b"content-length", b"ten")]},
            error_response(
                400,
                b'{"error":{"message":"Invalid content-length: \'ten\'","type":'
                b'"invalid_request_error","code":"invalid_request","param":null}}',
            ),
            id="400-bad-content-length",
        ),
        pytest.param(
            {"check_error": ModelNotFound("m")},
            error_response(
                404,
                b'{"error":{"message":"The model `m` does not exist.","type":"not_found_error",'
                b'"code":"model_not_found","param":"model"}}',
            ),
            id="404-model",
        ),
        pytest.param(
            {"submit_error": DuplicateRequestId("dup", param="X-Request-Id")},
            error_response(
                409,
                b'{"error":{"message":"dup","type":"invalid_request_error",'
                b'"code":"duplicate_request_id","param":"X-Request-Id"}}',
            ),
            id="409-duplicate-id",
        ),
        pytest.param(
            {"headers": [ID, (b"content-length", b"10000001")]},
            error_response(413, TOO_LARGE_BODY),
            id="413-announced",
        ),
        pytest.param(
            {"body": [b" " * 6_000_000, b" " * 6_000_000]},
            error_response(413, TOO_LARGE_BODY),
            id="413-streamed",
        ),
        pytest.param(
            {"check_error": NoWorkerAvailable("none", retry_after_s=1.0)},
            error_response(503, NO_WORKER_BODY, (b"retry-after", b"1")),
            id="503-no-worker",
        ),
        pytest.param(
            {"script": [from_message(FAILED)]},
            error_response(503, NO_WORKER_BODY, (b"retry-after", b"2")),
            id="503-upstream-failed",
        ),
        pytest.param({}, error_response(504, TIMEOUT_BODY), id="504-first-event"),
        pytest.param(
            {"check_error": RuntimeError("boom")},
            error_response(
                500,
                b'{"error":{"message":"Internal server error.","type":"internal_server_error",'
                b'"code":"internal_error","param":null}}',
            ),
            id="500-bug",
        ),
        pytest.param(
            {"body": [b"{"], "disconnect_in_body": True},
            error_response(
                500,
                b'{"error":{"message":"client disconnected prematurely","type":'
                b'"internal_server_error","code":"internal_error","param":null}}',
            ),
            id="500-disconnect-in-body",
        ),
    ],
)
async def test_failure_before_the_first_event_is_its_own_response(
    kwargs: dict[str, Any], expected: list[dict[str, Any]]
) -> None:
    bus, readiness = FakeBus(), Readiness()
    bus.check_error = kwargs.pop("check_error", None)
    bus.submit_error = kwargs.pop("submit_error", None)
    done = await exchange(bus=bus, readiness=readiness, **kwargs)
    assert done.sent == expected
    assert done.access["status"] == expected[0]["status"]
    assert done.access["error"] == error_of(done)["code"]
    assert done.access["ttft_ms"] is None
    expected_cancels = [("r1", "timeout")] if expected[0]["status"] == 504 else []
    assert bus.cancelled == expected_cancels


async def test_server_side_failures_log_one_warning_and_bugs_one_traceback() -> None:
    timeout = await exchange()
    assert [(line["event"], line["log_level"]) for line in timeout.logs] == [
        ("request_failed", "warning"),
        ("request_finished", "info"),
    ]
    bus = FakeBus()
    bus.check_error = RuntimeError("boom")
    crash = await exchange(bus=bus)
    assert [(line["event"], line["log_level"]) for line in crash.logs] == [
        ("request_crashed", "error"),
        ("request_finished", "info"),
    ]


# --- failures after the headers: in-band ---------------------------------------------------------


async def test_failure_mid_stream_ends_with_an_error_event_then_done() -> None:
    done = await exchange([STREAM_BODY], script=[CHUNK, from_message(FAILED)])
    tail = b"data: " + NO_WORKER_BODY + b"\n\ndata: [DONE]\n\n"
    assert done.sent == [start(200, SSE), body(CHUNK.data + tail)]
    assert (done.access["status"], done.access["error"]) == (200, "no_worker_available")
    assert done.bus.cancelled == []
    assert ("stream_failed", "warning") in [
        (line["event"], line["log_level"]) for line in done.logs
    ]


async def test_stream_that_goes_idle_ends_with_a_timeout_event_and_cancels() -> None:
    done = await exchange([STREAM_BODY], script=[CHUNK])
    tail = b"data: " + TIMEOUT_BODY + b"\n\ndata: [DONE]\n\n"
    assert done.sent == [start(200, SSE), body(CHUNK.data, more=True), body(tail)]
    assert (done.access["status"], done.access["error"]) == (200, "timeout")
    assert done.bus.cancelled == [("r1", "timeout")]


async def test_a_bug_mid_stream_ends_with_an_internal_error_event() -> None:
    done = await exchange([STREAM_BODY], script=[CHUNK, None])
    error = (
        b'{"error":{"message":"Internal error: AttributeError","type":"internal_server_error",'
        b'"code":"internal_error","param":null}}'
    )
    assert done.sent == [
        start(200, SSE),
        body(CHUNK.data + b"data: " + error + b"\n\ndata: [DONE]\n\n"),
    ]
    assert done.access["error"] == "internal_error"
    assert done.bus.cancelled == [("r1", "internal_error")]


# --- client disconnects --------------------------------------------------------------------------


async def _leave(bus: FakeBus, gone: asyncio.Event) -> None:
    await asyncio.sleep(0.05)
    gone.set()


async def test_disconnect_before_the_first_event_cancels_and_logs_499() -> None:
    done = await exchange(client=_leave)
    assert done.sent == []
    assert (done.access["status"], done.access["error"]) == (499, "client_disconnected")
    assert done.bus.cancelled == [("r1", "client_disconnected")]


async def test_disconnect_mid_stream_cancels_once() -> None:
    done = await exchange([STREAM_BODY], script=[CHUNK], client=_leave)
    assert done.sent == [start(200, SSE), body(CHUNK.data, more=True)]
    assert (done.access["status"], done.access["error"]) == (200, "client_disconnected")
    assert done.bus.cancelled == [("r1", "client_disconnected")]


# --- metrics -------------------------------------------------------------------------------------


def _samples(metrics: GatewayMetrics) -> dict[str, float]:
    rows = metrics.exposition().decode().splitlines()
    return {
        key: float(value)
        for key, _, value in (row.rpartition(" ") for row in rows if not row.startswith("#"))
    }


async def test_metrics_count_the_request_its_latency_ttft_and_error() -> None:
    ok = _samples((await exchange(script=[JSON_DONE])).metrics)
    endpoint = '{endpoint="/v1/chat/completions"}'
    assert ok['jetserve_http_requests_total{endpoint="/v1/chat/completions",status="200"}'] == 1
    assert ok[f"jetserve_http_request_seconds_count{endpoint}"] == 1
    assert ok[f"jetserve_gateway_ttft_seconds_count{endpoint}"] == 1
    timeout = _samples((await exchange()).metrics)
    assert (
        timeout['jetserve_http_requests_total{endpoint="/v1/chat/completions",status="504"}'] == 1
    )
    assert timeout.get(f"jetserve_gateway_ttft_seconds_count{endpoint}", 0) == 0
    assert timeout['jetserve_errors_total{code="timeout",service="gateway"}'] == 1


# --- everything else goes to Litestar ------------------------------------------------------------


async def test_other_methods_on_the_inference_paths_are_405() -> None:
    done = await exchange(method="GET")
    assert done.sent == error_response(
        405,
        b'{"error":{"message":"Method GET is not allowed on /v1/chat/completions.","type":'
        b'"invalid_request_error","code":"method_not_allowed","param":null}}',
        (b"allow", b"POST"),
    )
    assert (done.access["method"], done.access["error"]) == ("GET", "method_not_allowed")
    assert done.bus.submitted == []


async def test_other_paths_go_to_litestar_with_the_request_id() -> None:
    unknown = await exchange(path="/v1/chat/completion")
    assert (unknown.sent[0]["status"], error_of(unknown)["type"]) == (404, "not_found_error")
    assert unknown.sent[0]["headers"][-1] == ID
    assert (unknown.access["log_level"], unknown.access["error"]) == ("info", "not_found")
    assert unknown.bus.submitted == []


@pytest.mark.parametrize("path", ["/health", "/live", "/metrics", "/v1/models"])
async def test_probes_log_their_access_line_at_debug(path: str) -> None:
    done = await exchange([b""], method="GET", path=path)
    assert (done.sent[0]["status"], done.sent[0]["headers"][-1]) == (200, ID)
    assert (done.access["log_level"], done.access["path"]) == ("debug", path)
    assert [line["event"] for line in done.logs] == ["request_finished"]
