"""The OpenAI chat shaper: reasoning, tool-call deltas, ``n`` choices and log-probabilities, as
the openai SDK's own types and stream accumulator read them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.lib.streaming.chat._completions import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from services.formatter.pieces import (
    ChoiceEnd,
    ChoiceResult,
    Collected,
    Content,
    Reasoning,
    TokenLogprobs,
    ToolCall,
    ToolCallArgs,
    ToolCallStart,
    TopLogprob,
)
from services.formatter.shapers import ChatShaper, shaper_for
from services.formatter.shaping import Nvext, usage
from shared.messages import OutputOptions, StreamOpen

USAGE = usage(5, 7, 0)


def chat_open(**output: Any) -> StreamOpen:
    return StreamOpen(
        request_id="r1",
        api="chat",
        model="m",
        reply_to="gw",
        created=1,
        prompt_tokens=5,
        output=OutputOptions(**output),
        max_tokens=16,
    )


def payloads(data: bytes) -> list[Any]:
    """The JSON objects of SSE ``data`` (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for part in data.split(b"\n\n")[:-1]:
        assert part.startswith(b"data: ")
        body = part.removeprefix(b"data: ")
        out.append("[DONE]" if body == b"[DONE]" else json.loads(body))
    return out


def call_stream(shaper: ChatShaper) -> bytes:
    """A streamed reasoning block, text, then two tool calls with split arguments."""
    return (
        shaper.opening()
        + shaper.delta(0, [Reasoning("Let me think.")])
        + shaper.delta(0, [Content("Checking.")])
        + shaper.delta(0, [ToolCallStart(0, "call_a", "get_weather")])
        + shaper.delta(0, [ToolCallArgs(0, '{"city": '), ToolCallArgs(0, '"Paris"}')])
        + shaper.delta(0, [ToolCallStart(1, "call_b", "get_time"), ToolCallArgs(1, "{}")])
        + shaper.choice_end(0, ChoiceEnd("stop", has_tool_calls=True))
        + shaper.closing(USAGE)
    )


def test_tool_call_fragments_have_the_openai_shape() -> None:
    objects = payloads(call_stream(ChatShaper(chat_open(stream=True))))
    deltas = [o["choices"][0]["delta"] for o in objects[:-1]]
    assert deltas[:3] == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "Let me think."},
        {"content": "Checking."},
    ]
    assert deltas[3] == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    }
    assert deltas[4:6] == [
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
    ]
    assert deltas[7] == {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}
    assert objects[-2]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "tool_calls",
    }
    assert objects[-1] == "[DONE]"


def test_the_sdk_accumulates_the_stream_into_the_message() -> None:
    state = ChatCompletionStreamState()
    for obj in payloads(call_stream(ChatShaper(chat_open(stream=True))))[:-1]:
        state.handle_chunk(ChatCompletionChunk.model_validate(obj))
    choice = state.get_final_completion().choices[0]
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_a", "get_weather", {"city": "Paris"}),
        ("call_b", "get_time", {}),
    ]
    assert (choice.message.content, choice.finish_reason) == ("Checking.", "tool_calls")


def test_deprecated_functions_stream_one_function_call() -> None:
    shaper = ChatShaper(chat_open(stream=True, legacy_functions=True))
    data = (
        shaper.opening()
        + shaper.delta(0, [ToolCallStart(0, "call_a", "get_weather")])
        + shaper.delta(0, [ToolCallArgs(0, '{"city": '), ToolCallArgs(0, '"Paris"}')])
        + shaper.choice_end(0, ChoiceEnd("stop", has_tool_calls=True))
        + shaper.closing(USAGE)
    )
    objects = payloads(data)[:-1]
    deltas = [o["choices"][0]["delta"] for o in objects]
    assert deltas[1:4] == [
        {"function_call": {"name": "get_weather", "arguments": ""}},
        {"function_call": {"arguments": '{"city": '}},
        {"function_call": {"arguments": '"Paris"}'}},
    ]
    assert objects[-1]["choices"][0]["finish_reason"] == "function_call"
    state = ChatCompletionStreamState()
    for obj in objects:
        state.handle_chunk(ChatCompletionChunk.model_validate(obj))
    message = state.get_final_completion().choices[0].message
    assert message.function_call is not None
    assert (message.function_call.name, message.function_call.arguments) == (
        "get_weather",
        '{"city": "Paris"}',
    )


def test_each_choice_has_its_role_chunk_index_and_finish() -> None:
    shaper = ChatShaper(chat_open(stream=True, n=2, extra_fields=("worker_id",)))
    data = (
        shaper.opening()
        + shaper.delta(1, [Content("b")])
        + shaper.delta(0, [Content("a")])
        + shaper.choice_end(1, ChoiceEnd("length"))
        + shaper.choice_end(0, ChoiceEnd("stop"))
        + shaper.closing(USAGE, Nvext(worker_id="w"))
    )
    objects = payloads(data)[:-1]
    summary = [
        (o["choices"][0]["index"], o["choices"][0]["delta"], o["choices"][0]["finish_reason"])
        for o in objects
    ]
    assert summary == [
        (0, {"role": "assistant", "content": ""}, None),
        (1, {"role": "assistant", "content": ""}, None),
        (1, {"content": "b"}, None),
        (0, {"content": "a"}, None),
        (1, {}, "length"),
        (0, {}, "stop"),
    ]
    assert [o.get("nvext") for o in objects] == [None] * 5 + [{"worker_id": "w"}]


def test_log_probabilities_in_the_chat_form() -> None:
    shaper = ChatShaper(chat_open(stream=True, logprobs=1))
    lp = TokenLogprobs("Hi", -0.25, (72, 105), (TopLogprob("Hi", -0.25, (72, 105)),))
    first = payloads(shaper.delta(0, [Content("Hi")], [lp]))[0]
    assert first["choices"][0]["logprobs"] == {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.25,
                "bytes": [72, 105],
                "top_logprobs": [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105]}],
            }
        ]
    }
    ChatCompletionChunk.model_validate(first)


def test_log_probabilities_without_text_still_go_out() -> None:
    shaper = ChatShaper(chat_open(stream=True, logprobs=0))
    lp = TokenLogprobs("\ufffd", float("-inf"), (240,))
    (obj,) = payloads(shaper.delta(0, [], [lp]))
    assert obj["choices"][0]["delta"] == {"content": ""}
    assert obj["choices"][0]["logprobs"]["content"][0]["logprob"] == -9999.0


def test_a_delta_with_nothing_is_no_bytes() -> None:
    assert ChatShaper(chat_open(stream=True)).delta(0, []) == b""


def _result(message: Collected, end: ChoiceEnd, index: int = 0) -> ChoiceResult:
    return ChoiceResult(index, message, end)


class TestBody:
    def test_only_tool_calls_make_content_null(self) -> None:
        calls = [ToolCall("call_a", "f", '{"x": 1}')]
        body = ChatShaper(chat_open()).body(
            [_result(Collected(content="\n", tool_calls=calls), ChoiceEnd("stop", True))], USAGE
        )
        message = json.loads(body)["choices"][0]["message"]
        assert message == {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1}'},
                }
            ],
        }
        parsed = ChatCompletion.model_validate_json(body)
        assert parsed.choices[0].finish_reason == "tool_calls"

    def test_deprecated_functions_answer_function_call(self) -> None:
        calls = [ToolCall("call_a", "f", '{"x": 1}')]
        body = ChatShaper(chat_open(legacy_functions=True)).body(
            [_result(Collected(content="", tool_calls=calls), ChoiceEnd("stop", True))], USAGE
        )
        parsed = ChatCompletion.model_validate_json(body)
        choice = parsed.choices[0]
        assert choice.finish_reason == "function_call"
        assert choice.message.tool_calls is None
        assert choice.message.function_call is not None
        assert choice.message.function_call.name == "f"
        assert json.loads(choice.message.function_call.arguments) == {"x": 1}

    def test_reasoning_only_when_there_is_some(self) -> None:
        shaper = ChatShaper(chat_open())
        with_reasoning = json.loads(
            shaper.body([_result(Collected("42", "hmm"), ChoiceEnd("stop"))], USAGE)
        )
        without = json.loads(shaper.body([_result(Collected("42"), ChoiceEnd("stop"))], USAGE))
        assert with_reasoning["choices"][0]["message"] == {
            "role": "assistant",
            "content": "42",
            "reasoning_content": "hmm",
        }
        assert without["choices"][0]["message"] == {"role": "assistant", "content": "42"}

    def test_n_choices_with_log_probabilities(self) -> None:
        lp = [TokenLogprobs("a", -1.0, (97,))]
        results = [
            ChoiceResult(0, Collected("a"), ChoiceEnd("stop"), lp),
            ChoiceResult(1, Collected("b"), ChoiceEnd("length"), []),
        ]
        body = ChatCompletion.model_validate_json(ChatShaper(chat_open(n=2)).body(results, USAGE))
        assert [(c.index, c.message.content, c.finish_reason) for c in body.choices] == [
            (0, "a", "stop"),
            (1, "b", "length"),
        ]
        first = body.choices[0].logprobs
        assert first is not None
        assert first.content is not None
        assert (first.content[0].token, first.content[0].bytes) == ("a", [97])


@pytest.mark.parametrize(
    ("fmt", "name"), [("anthropic", "AnthropicShaper"), ("responses", "ResponsesShaper")]
)
def test_shaper_for_picks_the_messages_and_responses_shapers(fmt: str, name: str) -> None:
    module = pytest.importorskip(f"services.formatter.shapers.{fmt}")
    shaper = shaper_for(chat_open(format=fmt))
    assert isinstance(shaper, getattr(module, name))
