"""OpenAI Responses requests -> ``Preprocess`` (``responses_api``)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from openai.types.responses import Response

from services.gateway.apis.openai_responses_api import (
    echo_fields,
    parse_responses,
    responses_to_preprocess,
    to_chat,
)
from shared.errors import InvalidRequest, from_message
from shared.messages import Preprocess, ResponseChunk
from tests.unit.gateway.test_relay import FAILED, exchange

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _preprocess(**fields: Any) -> Preprocess:
    request = parse_responses(msgspec.json.encode({"model": "m", **fields}))
    return responses_to_preprocess(to_chat(request), request_id="r1", reply_to="reply", created=7)


def _refused(**fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        to_chat(parse_responses(msgspec.json.encode({"model": "m", **fields})))
    return info.value


def test_a_string_input_with_instructions_becomes_system_and_user() -> None:
    pre = _preprocess(
        input="Hi",
        instructions="Be brief.",
        max_output_tokens=32,
        temperature=0.3,
        top_p=0.8,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        stream=True,
        store=True,
        metadata={"k": "v"},
    )
    assert pre.api == "chat"
    assert pre.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    )
    assert pre.max_tokens == 32
    assert pre.sampling.temperature == 0.3
    assert pre.sampling.top_p == 0.8
    assert (pre.sampling.presence_penalty, pre.sampling.frequency_penalty) == (0.5, -0.25)
    assert pre.output.format == "responses"
    assert pre.output.stream is True
    # No reasoning setting: the template's own default.
    assert pre.chat_template_kwargs == {}


def test_items_become_messages_tool_calls_and_tool_results() -> None:
    pre = _preprocess(
        input=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Two calls."}],
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {
                "type": "function_call",
                "call_id": "call_2",
                "name": "get_weather",
                "arguments": '{"city": "Rome"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": "Rain"},
            {
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "Sunny, then rain.", "annotations": []}
                ],
            },
            {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
        ],
        tools=[TOOL],
    )
    call: dict[str, Any] = {"type": "function", "function": {"name": "get_weather"}}
    assert pre.messages == (
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    **call,
                    "id": "call_1",
                    "function": {**call["function"], "arguments": '{"city": "Paris"}'},
                },
                {
                    **call,
                    "id": "call_2",
                    "function": {**call["function"], "arguments": '{"city": "Rome"}'},
                },
            ],
            "reasoning_content": "Two calls.",
        },
        {"role": "tool", "content": "Sunny", "tool_call_id": "call_1"},
        {"role": "tool", "content": "Rain", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "Sunny, then rain."},
        {"role": "user", "content": "Thanks"},
    )
    assert pre.tools == (
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather.",
                "parameters": TOOL["parameters"],
            },
        },
    )


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("required", "required"),
        ({"type": "function", "name": "get_weather"}, "get_weather"),
    ],
)
def test_tool_choice(choice: Any, expected: str) -> None:
    pre = _preprocess(input="Hi", tools=[TOOL], tool_choice=choice, parallel_tool_calls=False)
    assert pre.sampling.guided is not None
    assert pre.sampling.guided.tool_choice == expected
    assert pre.sampling.guided.parallel_tool_calls is False


def test_reasoning_effort_switches_thinking() -> None:
    assert _preprocess(input="x", reasoning={"effort": "none"}).chat_template_kwargs == {
        "enable_thinking": False
    }
    assert _preprocess(input="x", reasoning={"effort": "high"}).chat_template_kwargs == {
        "enable_thinking": True
    }


def test_text_format_is_guided() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    pre = _preprocess(
        input="x", text={"format": {"type": "json_schema", "name": "out", "schema": schema}}
    )
    assert pre.sampling.guided is not None
    assert pre.sampling.guided.json_schema == schema
    pre = _preprocess(input="x", text={"format": {"type": "json_object"}})
    assert pre.sampling.guided is not None
    assert pre.sampling.guided.json_object is True


def test_logprobs_are_asked_for_with_top_logprobs_or_include() -> None:
    assert _preprocess(input="x", top_logprobs=3).output.logprobs == 3
    assert _preprocess(input="x", include=["message.output_text.logprobs"]).output.logprobs == 0
    assert _preprocess(input="x").output.logprobs is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "x", "previous_response_id": "msg_1"}, "previous_response_id"),
        ({"input": "x", "previous_response_id": "resp_1.2"}, "previous_response_id"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({}, "input"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].file_id",
        ),
        (
            {"input": [{"type": "compaction", "encrypted_content": "x"}]},
            "input[0].encrypted_content",
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": "x", "max_output_tokens": 8}, "max_output_tokens"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"input": "x", "n": 2}, "n"),
    ],
    ids=[
        "previous-response-not-resp",
        "previous-response-bad-characters",
        "conversation",
        "no-input",
        "empty-input",
        "no-items",
        "item-reference",
        "image",
        "file-id",
        "foreign-compaction",
        "call-without-id",
        "hosted-tool",
        "required-without-tools",
        "tiny-max-output",
        "temperature",
        "schema-missing",
        "unknown-field",
    ],
)
def test_bad_requests_are_400_naming_the_field(fields: dict[str, Any], param: str) -> None:
    error = _refused(**fields)
    assert error.status == 400
    assert error.param == param


async def test_a_failure_mid_stream_ends_with_a_numbered_error_event() -> None:

    first = ResponseChunk(
        request_id="r1",
        data=b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
        b'event: response.in_progress\ndata: {"type":"response.in_progress",'
        b'"sequence_number":1}\n\n',
    )
    body = msgspec.json.encode({"model": "m", "input": "Hi", "stream": True})
    done = await exchange([body], path="/v1/responses", script=[first, from_message(FAILED)])
    assert done.sent[0]["status"] == 200
    data = done.sent[1]["body"]
    tail = data.removeprefix(first.data)
    assert tail.startswith(b"event: error\ndata: ")
    assert msgspec.json.decode(tail.split(b"data: ", 1)[1]) == {
        "type": "error",
        "code": "no_worker_available",
        "message": "none",
        "param": None,
        "sequence_number": 2,
    }
    assert b"[DONE]" not in data


async def test_an_unknown_previous_response_is_a_400_in_openai_shape() -> None:

    body = msgspec.json.encode({"model": "m", "input": "Hi", "previous_response_id": "resp_1"})
    done = await exchange([body], path="/v1/responses")
    assert done.sent[0]["status"] == 400
    error = msgspec.json.decode(done.sent[1]["body"])["error"]
    assert error == {
        "message": "Previous response with id 'resp_1' not found.",
        "type": "invalid_request_error",
        "code": "previous_response_not_found",
        "param": "previous_response_id",
    }


def test_echo_fields_repeat_the_request_as_openai_shows_it() -> None:
    request = parse_responses(
        msgspec.json.encode(
            {
                "model": "m",
                "input": "Hi",
                "instructions": "Be brief.",
                "tools": [TOOL],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "max_output_tokens": 64,
                "temperature": 0.2,
                "reasoning": {"effort": "low"},
                "metadata": {"k": "v"},
                "store": True,
                "presence_penalty": 0.5,
                "safety_identifier": "user-7",
                "prompt_cache_key": "shared-prefix",
            }
        )
    )
    echo = echo_fields(request, response_id="resp_9", stored=True)
    assert echo == {
        "id": "resp_9",
        "previous_response_id": None,
        "instructions": "Be brief.",
        "max_output_tokens": 64,
        "max_tool_calls": None,
        "parallel_tool_calls": True,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.0,
        "prompt_cache_key": "shared-prefix",
        "reasoning": {"effort": "low", "summary": None},
        "safety_identifier": "user-7",
        "store": True,
        "temperature": 0.2,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": {"type": "function", "name": "get_weather"},
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "Weather.",
                "parameters": TOOL["parameters"],
                "strict": True,
            }
        ],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "user": None,
        "metadata": {"k": "v"},
    }
    Response.model_validate(
        {
            "object": "response",
            "created_at": 1,
            "model": "m",
            "output": [],
            **echo,
        }
    )
