"""Anthropic Messages requests -> ``Preprocess`` (``anthropic_api``), Anthropic's error dialect
(``responses.ANTHROPIC``) and its in-stream error event."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.gateway.apis.anthropic import (
    messages_to_preprocess,
    parse_count_tokens,
    parse_messages,
    to_chat,
)
from services.gateway.config import GatewayConfig
from services.gateway.core.admission import Admission
from services.gateway.http import sse
from services.gateway.http.app import create_app
from services.gateway.http.error_dialects import ANTHROPIC, anthropic_status
from shared.errors import (
    AllWorkersBusy,
    InvalidRequest,
    ModelNotFound,
    NoWorkerAvailable,
    Overloaded,
    ServiceUnavailable,
    UpstreamTimeout,
    from_message,
)
from shared.messages import CountTokens, Preprocess
from tests.unit.gateway.fakes import FakeBus
from tests.unit.gateway.test_relay import CHUNK, FAILED, exchange

TOOL = {
    "name": "get_weather",
    "description": "Weather.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _preprocess(**fields: Any) -> Preprocess:
    body = {"model": "m", "max_tokens": 64, **fields}
    request = parse_messages(msgspec.json.encode(body))
    return messages_to_preprocess(to_chat(request), request_id="r1", reply_to="reply", created=7)


def _refused(body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        to_chat(parse_messages(msgspec.json.encode(body)))
    return info.value


def test_a_plain_request_becomes_a_chat_preprocess_in_anthropic_format() -> None:
    pre = _preprocess(
        messages=[{"role": "user", "content": "Hi"}],
        system="Be brief.",
        stop_sequences=["\n\nHuman:", "END", "a", "b", "c"],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stream=True,
        metadata={"user_id": "u1"},
    )
    assert pre.api == "chat"
    assert pre.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    )
    assert pre.max_tokens == 64
    assert pre.sampling.temperature == 0.5
    assert pre.sampling.top_p == 0.9
    assert pre.sampling.top_k == 40
    assert pre.output.format == "anthropic"
    assert pre.output.stream is True
    # More than OpenAI's four stop strings: Anthropic sets no such limit.
    assert pre.output.stop == ("\n\nHuman:", "END", "a", "b", "c")
    assert pre.tools is None
    # Anthropic never thinks unless asked.
    assert pre.chat_template_kwargs == {"enable_thinking": False}


def test_blocks_become_tool_calls_tool_messages_and_reasoning() -> None:
    pre = _preprocess(
        system=[{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Call it.", "signature": "sig"},
                    {"type": "text", "text": "Let me look."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "Sunny"}],
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        tools=[TOOL],
    )
    assert pre.messages == (
        {"role": "system", "content": "One.\nTwo."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
            "reasoning_content": "Call it.",
        },
        {"role": "tool", "content": "Sunny", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "And tomorrow?"},
    )
    assert pre.tools == (
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather.",
                "parameters": TOOL["input_schema"],
            },
        },
    )


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", True),
        ({"type": "any"}, "required", True),
        ({"type": "tool", "name": "get_weather"}, "get_weather", True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ],
)
def test_tool_choice_maps_to_openai_choices(
    choice: dict[str, Any], expected: str, parallel: bool
) -> None:
    pre = _preprocess(
        messages=[{"role": "user", "content": "Hi"}], tools=[TOOL], tool_choice=choice
    )
    guided = pre.sampling.guided
    assert guided is not None
    assert guided.tool_choice == expected
    assert guided.parallel_tool_calls is parallel
    assert guided.tools[0]["name"] == "get_weather"


def test_tool_choice_none_sends_no_tools() -> None:
    pre = _preprocess(
        messages=[{"role": "user", "content": "Hi"}], tools=[TOOL], tool_choice={"type": "none"}
    )
    assert pre.tools is None


def test_thinking_enabled_sets_enable_thinking_and_its_budget() -> None:
    pre = _preprocess(
        max_tokens=4096,
        messages=[{"role": "user", "content": "Hi"}],
        thinking={"type": "enabled", "budget_tokens": 2048},
    )
    assert pre.chat_template_kwargs == {"enable_thinking": True}
    assert pre.sampling.guided is not None
    assert pre.sampling.guided.max_thinking_tokens == 2048
    disabled = _preprocess(
        messages=[{"role": "user", "content": "Hi"}], thinking={"type": "disabled"}
    )
    assert disabled.chat_template_kwargs == {"enable_thinking": False}
    adaptive = _preprocess(
        messages=[{"role": "user", "content": "Hi"}], thinking={"type": "adaptive"}
    )
    assert adaptive.chat_template_kwargs == {"enable_thinking": True}


def test_output_config_json_schema_is_guided() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    pre = _preprocess(
        messages=[{"role": "user", "content": "Hi"}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert pre.sampling.guided is not None
    assert pre.sampling.guided.json_schema == schema


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 0, "messages": []}, "max_tokens"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 5, "messages": "hi"}, "messages"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
            "messages[0].role",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            },
            "messages[0].content[0].source.type",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "temperature": 1.5,
            },
            "temperature",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "s", "input_schema": {}}],
            },
            "tools[0].type",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "any"},
            },
            "tool_choice",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [TOOL],
                "tool_choice": {"type": "tool", "name": "other"},
            },
            "tool_choice.name",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5000,
                "messages": [{"role": "user", "content": "x"}],
                "thinking": {"type": "enabled", "budget_tokens": 100},
            },
            "thinking.budget_tokens",
        ),
        (
            {
                "model": "m",
                "max_tokens": 2000,
                "messages": [{"role": "user", "content": "x"}],
                "thinking": {"type": "enabled", "budget_tokens": 2000},
            },
            "thinking.budget_tokens",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "stop_sequences": [" "],
            },
            "stop_sequences[0]",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "n": 2},
            "n",
        ),
    ],
    ids=[
        "no-max-tokens",
        "zero-max-tokens",
        "no-messages",
        "messages-type",
        "system-role",
        "image",
        "temperature",
        "server-tool",
        "any-without-tools",
        "unknown-tool",
        "small-budget",
        "budget-over-max",
        "blank-stop",
        "unknown-field",
    ],
)
def test_bad_requests_are_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    error = _refused(body)
    assert error.status == 400
    assert error.param == param


def test_unknown_fields_are_ignored_when_allowed() -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "n": 2}
    request = parse_messages(msgspec.json.encode(body), allow_unknown=True)
    assert request.max_tokens == 5


def test_count_tokens_needs_no_max_tokens_and_keeps_tools() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [TOOL]}
    request = parse_count_tokens(msgspec.json.encode(body))
    pre = messages_to_preprocess(to_chat(request), request_id="r", reply_to="x", created=1)
    assert pre.tools is not None
    assert pre.max_tokens is None
    assert pre.output.format == "anthropic"
    with pytest.raises(InvalidRequest):
        parse_count_tokens(b'{"model": "m", "messages": [], "max_tokens": 5}')


# --- the error dialect ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "error_type"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error"),
        (ModelNotFound("m"), 404, "not_found_error"),
        (Overloaded("full"), 529, "overloaded_error"),
        (AllWorkersBusy("busy"), 529, "overloaded_error"),
        (NoWorkerAvailable("none"), 529, "overloaded_error"),
        (ServiceUnavailable("bus"), 503, "api_error"),
        (UpstreamTimeout("slow"), 504, "timeout_error"),
    ],
)
def test_anthropic_errors_have_anthropic_types_and_statuses(
    error: Any, status: int, error_type: str
) -> None:
    got_status, body = ANTHROPIC.render(error.status, error, "req1")
    assert got_status == status
    assert msgspec.json.decode(body) == {
        "type": "error",
        "error": {"type": error_type, "message": error.message},
        "request_id": "req1",
    }


def test_anthropic_statuses_of_litestar_errors() -> None:
    assert anthropic_status(413, "invalid_request") == (413, "request_too_large")
    assert anthropic_status(405, "method_not_allowed") == (405, "invalid_request_error")
    assert anthropic_status(500, "internal_error") == (500, "api_error")


def test_a_stream_failure_ends_with_an_anthropic_error_event() -> None:
    tail = ANTHROPIC.stream_tail(Overloaded("full"), b"")
    assert tail == (
        b"event: error\n"
        b'data: {"type":"error","error":{"type":"overloaded_error","message":"full"}}\n\n'
    )


def test_a_responses_stream_failure_is_numbered_after_the_last_event() -> None:
    sent = b'event: x\ndata: {"sequence_number":4}\n\nevent: y\ndata: {"sequence_number":5}\n\n'
    tail = sse.responses_error_tail(UpstreamTimeout("slow"), sent)
    name, data = tail.split(b"\n", 1)
    assert name == b"event: error"
    payload = msgspec.json.decode(data.removeprefix(b"data: "))
    assert payload == {
        "type": "error",
        "code": "timeout",
        "message": "slow",
        "param": None,
        "sequence_number": 6,
    }


# --- on the wire (Relay with a fake bus) ---------------------------------------------------------

ANTHROPIC_BODY = msgspec.json.encode(
    {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
)
ANTHROPIC_STREAM = msgspec.json.encode(
    {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
)


def _headers(message: dict[str, Any]) -> dict[bytes, bytes]:
    return dict(message["headers"])


async def test_an_unknown_model_is_a_404_in_anthropic_shape_with_request_id() -> None:

    bus = FakeBus()
    bus.check_error = ModelNotFound("m")
    done = await exchange([ANTHROPIC_BODY], path="/v1/messages", bus=bus)
    assert done.sent[0]["status"] == 404
    headers = _headers(done.sent[0])
    assert headers[b"request-id"] == headers[b"x-request-id"] == b"r1"
    assert msgspec.json.decode(done.sent[1]["body"]) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "The model `m` does not exist."},
        "request_id": "r1",
    }
    assert done.access["status"] == 404


async def test_a_bad_body_is_a_400_in_anthropic_shape() -> None:

    done = await exchange([b'{"model": "m"}'], path="/v1/messages")
    assert done.sent[0]["status"] == 400
    error = msgspec.json.decode(done.sent[1]["body"])["error"]
    assert error["type"] == "invalid_request_error"
    assert "max_tokens" in error["message"] or "messages" in error["message"]


async def test_a_failure_mid_stream_ends_with_an_anthropic_error_event() -> None:

    done = await exchange(
        [ANTHROPIC_STREAM], path="/v1/messages", script=[CHUNK, from_message(FAILED)]
    )
    assert done.sent[0]["status"] == 200
    assert _headers(done.sent[0])[b"request-id"] == b"r1"
    data = done.sent[1]["body"]
    assert data.startswith(CHUNK.data)
    assert data.removeprefix(CHUNK.data) == (
        b"event: error\n"
        b'data: {"type":"error","error":{"type":"overloaded_error","message":"none"}}\n\n'
    )


async def test_the_relay_answers_count_tokens_from_the_bus() -> None:

    asked: list[CountTokens] = []

    class CountingBus(FakeBus):
        async def count_tokens(self, ask: CountTokens, timeout_s: float) -> int:
            asked.append(ask)
            return 42

    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
    done = await exchange([body], path="/v1/messages/count_tokens", bus=CountingBus())
    assert done.sent[0]["status"] == 200
    assert done.sent[1]["body"] == b'{"input_tokens":42}'
    assert asked[0].request.output.format == "anthropic"
    assert asked[0].request.messages == ({"role": "user", "content": "Hi"},)
    assert done.bus.submitted == []
    assert done.access["prompt_tokens"] == 42


async def test_a_full_gateway_refuses_messages_with_529_overloaded_error() -> None:
    admission = Admission(1)
    assert admission.try_enter()  # the one slot is taken
    config = GatewayConfig(gateway_id="gw")
    app = create_app(config, bus=FakeBus(), admission=admission)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": ANTHROPIC_BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/messages",
        "headers": [(b"x-request-id", b"r9")],
        "query_string": b"",
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == 529
    headers = _headers(sent[0])
    assert headers[b"retry-after"] == b"1"
    assert headers[b"request-id"] == b"r9"
    error = msgspec.json.decode(sent[1]["body"])
    assert error["type"] == "error"
    assert error["error"]["type"] == "overloaded_error"
