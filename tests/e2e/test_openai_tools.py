"""Tool calling end to end with the official ``openai`` SDK: ``tool_choice`` ``required``, a
named function, ``auto`` and ``none``; parallel calls; the streamed ``delta.tool_calls``
reassembled against the whole answer (also when ``max_tokens`` cuts the call); and the
multi-turn round trip (the SDK's own tool-call objects sent back, then a tool result, then a
text answer). The stack's mocker writes Hermes-syntax calls with arguments valid against each
tool's ``parameters``; the formatter's parser turns them back into OpenAI tool calls."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageToolCall
from pydantic import BaseModel, Field

from tests.e2e.conftest import MODEL

ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"timezone": {"type": "string"}},
    "required": ["timezone"],
}
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast in a city.",
        "parameters": WEATHER_PARAMETERS,
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a timezone.",
        "parameters": TIME_PARAMETERS,
    },
}
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
CHOICES = pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])


def arguments_of(call: ChatCompletionMessageToolCall) -> dict[str, Any]:
    """The call's arguments: a JSON object valid against its tool's ``parameters``."""
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments, dict)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


async def reassemble(stream: Any) -> tuple[str, list[dict[str, Any]], list[str | None]]:
    """Content, tool calls (by ``index``) and finish reasons of a streamed chat answer.

    Checks the OpenAI streaming shape on the way: a call's first fragment carries its ``id``,
    ``type`` and name, later fragments only argument text."""
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    finishes: list[str | None] = []
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for fragment in choice.delta.tool_calls or []:
                function = fragment.function
                if fragment.index not in calls:
                    assert fragment.id, "the first fragment of a call carries its id"
                    assert fragment.type == "function"
                    assert function is not None
                    assert function.name
                    calls[fragment.index] = {
                        "id": fragment.id,
                        "name": function.name,
                        "arguments": function.arguments or "",
                    }
                else:
                    assert fragment.id is None, "only the first fragment carries the id"
                    assert function is not None
                    assert not function.name
                    calls[fragment.index]["arguments"] += function.arguments or ""
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    assert sorted(calls) == list(range(len(calls))), "tool call indexes count from 0"
    return content, [calls[i] for i in sorted(calls)], finishes


@CHOICES
async def test_a_required_tool_choice_gives_one_valid_call(
    client: openai.AsyncOpenAI, tool_choice: Any
) -> None:
    resp = await client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        max_tokens=200,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    call = calls[0]
    assert isinstance(call, ChatCompletionMessageToolCall)
    assert call.id.startswith("call_")
    assert call.type == "function"
    if tool_choice == NAMED:
        assert call.function.name == "get_weather"
    arguments_of(call)
    assert resp.usage is not None
    assert resp.usage.completion_tokens > 5


@CHOICES
async def test_the_streamed_call_reassembles_to_the_whole_answer(
    client: openai.AsyncOpenAI, tool_choice: Any
) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": tool_choice,
        "max_tokens": 200,
        "seed": 11,
    }
    whole = await client.chat.completions.create(**kwargs)
    expected = whole.choices[0].message.tool_calls or []
    assert len(expected) == 1
    assert isinstance(expected[0], ChatCompletionMessageToolCall)
    stream = await client.chat.completions.create(**kwargs, stream=True)
    content, calls, finishes = await reassemble(stream)
    assert content == ""
    assert finishes == ["tool_calls"]
    assert [c["name"] for c in calls] == ["get_weather"]
    assert calls[0]["id"].startswith("call_")
    streamed = json.loads(calls[0]["arguments"])
    jsonschema.validate(streamed, WEATHER_PARAMETERS)
    assert streamed == arguments_of(expected[0])


async def test_parallel_tool_calls_give_one_call_per_tool(client: openai.AsyncOpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather in Paris, and the time there?"}],
        "tools": [WEATHER, TIME],
        "tool_choice": "required",
        "parallel_tool_calls": True,
        "max_tokens": 300,
    }
    whole = await client.chat.completions.create(**kwargs)
    assert whole.choices[0].finish_reason == "tool_calls"
    calls = whole.choices[0].message.tool_calls or []
    assert len(calls) == 2
    assert all(isinstance(c, ChatCompletionMessageToolCall) for c in calls)
    typed = [c for c in calls if isinstance(c, ChatCompletionMessageToolCall)]
    assert len({c.id for c in typed}) == 2
    assert {c.function.name for c in typed} == {"get_weather", "get_time"}
    for call in typed:
        arguments_of(call)

    stream = await client.chat.completions.create(**kwargs, stream=True)
    _, streamed, finishes = await reassemble(stream)
    assert finishes == ["tool_calls"]
    assert len(streamed) == 2  # reassemble checked the indexes are 0 and 1
    assert [c["name"] for c in streamed] == [c.function.name for c in typed]
    assert [json.loads(c["arguments"]) for c in streamed] == [arguments_of(c) for c in typed]


async def test_auto_on_a_user_turn_calls_a_tool(client: openai.AsyncOpenAI) -> None:
    resp = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="auto", max_tokens=200
    )
    assert resp.choices[0].finish_reason == "tool_calls"
    calls = resp.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls if isinstance(c, ChatCompletionMessageToolCall)] == [
        "get_weather"
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_tool_choice_none_answers_in_plain_text(
    client: openai.AsyncOpenAI, stream: bool
) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "none",
        "max_tokens": 20,
    }
    if stream:
        content, calls, finishes = await reassemble(
            await client.chat.completions.create(**kwargs, stream=True)
        )
        n_calls = len(calls)
    else:
        resp = await client.chat.completions.create(**kwargs)
        content = resp.choices[0].message.content or ""
        n_calls = len(resp.choices[0].message.tool_calls or [])
        finishes = [resp.choices[0].finish_reason]
    assert content.strip()
    assert "<tool_call>" not in content
    assert n_calls == 0
    assert finishes == ["length"]


async def test_a_tool_round_trip_ends_in_a_text_answer(client: openai.AsyncOpenAI) -> None:
    first = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=200
    )
    assistant = first.choices[0].message
    calls = assistant.tool_calls or []
    assert len(calls) == 1
    # The SDK's own message object goes back as the assistant turn, as agents do.
    conversation: list[Any] = [
        *ASK,
        assistant,
        {"role": "tool", "tool_call_id": calls[0].id, "content": "Sunny, 21 degrees."},
    ]
    final = await client.chat.completions.create(
        model=MODEL, messages=conversation, tools=[WEATHER], tool_choice="auto", max_tokens=4000
    )
    answer = final.choices[0]
    assert answer.message.tool_calls is None
    assert answer.message.content
    assert answer.message.content.strip()
    assert "<tool_call>" not in answer.message.content
    assert answer.finish_reason == "stop"
    assert final.usage is not None
    assert first.usage is not None
    # The prompt now holds the call and its result: it is longer than the first one.
    assert final.usage.prompt_tokens > first.usage.prompt_tokens + 10

    stream = await client.chat.completions.create(
        model=MODEL,
        messages=conversation,
        tools=[WEATHER],
        tool_choice="auto",
        max_tokens=4000,
        stream=True,
    )
    content, streamed_calls, finishes = await reassemble(stream)
    assert (content, streamed_calls, finishes) == (answer.message.content, [], ["stop"])


def whole_answer(resp: ChatCompletion) -> tuple[str, list[tuple[str, Any]], str | None]:
    choice = resp.choices[0]
    calls = [
        (c.function.name, json.loads(c.function.arguments))
        for c in choice.message.tool_calls or []
        if isinstance(c, ChatCompletionMessageToolCall)
    ]
    return choice.message.content or "", calls, choice.finish_reason


async def test_a_call_cut_by_max_tokens_streams_as_it_answers_whole(
    client: openai.AsyncOpenAI,
) -> None:
    """Decision 019: cut before its arguments begin, a call is content; cut after, it is closed
    into valid JSON; either way the stream and the whole answer agree, at every cut."""
    base: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "seed": 5,
    }
    full = await client.chat.completions.create(**base, max_tokens=200)
    assert full.usage is not None
    length = full.usage.completion_tokens
    assert 10 < length < 100
    seen_content = seen_call = False
    for cut in range(1, length):
        whole = await client.chat.completions.create(**base, max_tokens=cut)
        content, calls, finish = whole_answer(whole)
        assert finish == "length"
        stream = await client.chat.completions.create(**base, max_tokens=cut, stream=True)
        s_content, s_calls, s_finishes = await reassemble(stream)
        assert s_finishes == ["length"], cut
        assert s_content == content, cut
        assert [(c["name"], json.loads(c["arguments"])) for c in s_calls] == calls, cut
        seen_content |= bool(content) and not calls
        seen_call |= bool(calls)
        for _, arguments in calls:
            assert isinstance(arguments, dict)
    assert seen_content
    assert seen_call


class Address(BaseModel):
    street: str
    zip_code: int = Field(ge=1000, le=99999)


class BookTable(BaseModel):
    """A pydantic tool as ``openai.pydantic_function_tool`` sends it: strict, ``$defs``/``$ref``,
    an optional field (``anyOf`` with ``null``), a list and bounds."""

    restaurant: str
    guests: int = Field(ge=1, le=12)
    address: Address
    notes: str | None
    dishes: list[str]


async def test_the_sdk_parses_a_pydantic_tool_whole_and_streamed(
    client: openai.AsyncOpenAI,
) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Book a table for four."}],
        "tools": [openai.pydantic_function_tool(BookTable)],
        "tool_choice": "required",
        "max_tokens": 300,
        "seed": 2,
    }
    whole = await client.chat.completions.parse(**kwargs)
    calls = whole.choices[0].message.tool_calls or []
    assert len(calls) == 1
    parsed = calls[0].function.parsed_arguments
    assert isinstance(parsed, BookTable)
    # The SDK's own stream helper reassembles the fragments and parses them again.
    async with client.chat.completions.stream(**kwargs) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds
    assert "tool_calls.function.arguments.done" in kinds
    assert final.choices[0].finish_reason == "tool_calls"
    streamed = final.choices[0].message.tool_calls or []
    assert [c.function.parsed_arguments for c in streamed] == [parsed]


TRICKY = [
    'a "quoted" word',
    "back\\slash",
    "line\nbreak\ttab",
    "emoji 😀 日本語 café",
    "</tool_call>",
    "<tool_call>",
    "</think>",
    '{"nested": "json"}',
]


@pytest.mark.parametrize("value", TRICKY, ids=range(len(TRICKY)))
async def test_arguments_with_escapes_and_markup_survive_whole_and_streamed(
    client: openai.AsyncOpenAI, value: str
) -> None:
    """A string argument with JSON escapes, non-ASCII text or the syntax's own tags (single
    added tokens in Qwen3's vocabulary) comes back exactly."""
    tool: Any = {
        "type": "function",
        "function": {
            "name": "echo",
            "parameters": {
                "type": "object",
                "properties": {"text": {"enum": [value]}},
                "required": ["text"],
            },
        },
    }
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "tools": [tool],
        "tool_choice": "required",
        "max_tokens": 100,
    }
    whole = await client.chat.completions.create(**kwargs)
    calls = whole.choices[0].message.tool_calls or []
    assert len(calls) == 1
    assert isinstance(calls[0], ChatCompletionMessageToolCall)
    assert json.loads(calls[0].function.arguments) == {"text": value}
    assert whole.choices[0].finish_reason == "tool_calls"
    content, streamed, finishes = await reassemble(
        await client.chat.completions.create(**kwargs, stream=True)
    )
    assert content == ""
    assert [c["arguments"] for c in streamed] == [calls[0].function.arguments]
    assert finishes == ["tool_calls"]


async def test_a_named_choice_calls_only_that_function(client: openai.AsyncOpenAI) -> None:
    resp = await client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=True,
        max_tokens=200,
    )
    calls = resp.choices[0].message.tool_calls or []
    assert calls
    for call in calls:
        assert isinstance(call, ChatCompletionMessageToolCall)
        assert call.function.name == "get_time"
        arguments_of(call)


LEGACY_WEATHER: dict[str, Any] = {
    "model": MODEL,
    "messages": ASK,
    "functions": [WEATHER["function"]],
    "function_call": {"name": "get_weather"},
    "max_tokens": 200,
}
"""A weather call asked for with the deprecated ``functions`` / ``function_call``."""


async def test_deprecated_functions_answer_with_function_call(client: openai.AsyncOpenAI) -> None:
    resp = await client.chat.completions.create(
        **LEGACY_WEATHER,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.tool_calls is None
    call = choice.message.function_call
    assert call is not None
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)


async def test_deprecated_functions_stream_a_function_call(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        **LEGACY_WEATHER,
        stream=True,
    )
    names: list[str] = []
    arguments = ""
    finishes: list[str] = []
    async for chunk in stream:
        for choice in chunk.choices:
            assert choice.delta.tool_calls is None
            call = choice.delta.function_call
            if call is not None:
                names += [call.name] if call.name else []
                arguments += call.arguments or ""
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    assert names == ["get_weather"]
    assert finishes == ["function_call"]
    jsonschema.validate(json.loads(arguments), WEATHER_PARAMETERS)
