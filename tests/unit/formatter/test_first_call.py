"""``OutputOptions.parallel_tool_calls`` false: only a choice's first tool call is answered,
whatever the engine wrote (vLLM's ``maybe_filter_parallel_tool_calls``), streamed and whole, in
every shape with tool calls (OpenAI chat, Responses, Anthropic). Real parsers, real tokenizer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.formatter.parsers.first_call import FirstCallOnly
from services.formatter.pieces import Content, ToolCallArgs, ToolCallStart, ToolPiece
from services.formatter.request import RequestFormatter
from shared.messages import OutputFormat, OutputOptions, StreamOpen
from tests.unit.formatter.test_request_parsing import one_token_batches, run
from tests.unit.formatter.test_shapers_openai_chat import payloads

TWO_CALLS = (
    'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "CET"}}\n</tool_call>'
)


def _open(fmt: OutputFormat, *, stream: bool, parallel: bool) -> StreamOpen:
    return StreamOpen(
        request_id="r1",
        api="chat",
        model="m",
        reply_to="gw",
        created=1,
        prompt_tokens=4,
        output=OutputOptions(
            stream=stream, tool_parser="hermes", format=fmt, parallel_tool_calls=parallel
        ),
        max_tokens=64,
    )


class _Scripted:
    """A tool parser that returns what it is told (the wrapper's own logic)."""

    def __init__(self, pieces: list[ToolPiece]) -> None:
        self.pieces = pieces

    def push(self, text: str) -> list[ToolPiece]:
        return self.pieces

    def flush(self) -> list[ToolPiece]:
        return [ToolCallArgs(2, "{}")]


def test_the_wrapper_keeps_call_zero_and_all_content() -> None:
    inner = _Scripted(
        [
            Content("a"),
            ToolCallStart(0, "c0", "f"),
            ToolCallArgs(0, "{}"),
            Content("\n"),
            ToolCallStart(1, "c1", "g"),
            ToolCallArgs(1, "{}"),
        ]
    )
    parser = FirstCallOnly(inner)
    assert parser.push("x") == [
        Content("a"),
        ToolCallStart(0, "c0", "f"),
        ToolCallArgs(0, "{}"),
        Content("\n"),
    ]
    assert parser.flush() == []


def test_non_streaming_chat_answers_only_the_first_call(tokenizer: Any) -> None:
    fmt = RequestFormatter(_open("openai", stream=False, parallel=False), tokenizer, now=0)
    choice = json.loads(run(fmt, one_token_batches(tokenizer, TWO_CALLS)))["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert choice["finish_reason"] == "tool_calls"


def test_streaming_chat_answers_only_the_first_call(tokenizer: Any) -> None:
    fmt = RequestFormatter(_open("openai", stream=True, parallel=False), tokenizer, now=0)
    objects = payloads(run(fmt, one_token_batches(tokenizer, TWO_CALLS)))
    fragments = [
        c
        for o in objects
        if isinstance(o, dict) and o.get("choices")
        for c in o["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert {f["index"] for f in fragments} == {0}
    assert [f["function"]["name"] for f in fragments if f["function"].get("name")] == [
        "get_weather"
    ]


def test_parallel_calls_are_all_answered_when_allowed(tokenizer: Any) -> None:
    fmt = RequestFormatter(_open("openai", stream=False, parallel=True), tokenizer, now=0)
    calls = json.loads(run(fmt, one_token_batches(tokenizer, TWO_CALLS)))["choices"][0]["message"][
        "tool_calls"
    ]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]


@pytest.mark.parametrize("fmt", ["anthropic", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_anthropic_and_responses_shapes_answer_only_the_first_call(
    tokenizer: Any, fmt: OutputFormat, stream: bool
) -> None:
    formatter = RequestFormatter(_open(fmt, stream=stream, parallel=False), tokenizer, now=0)
    body = run(formatter, one_token_batches(tokenizer, TWO_CALLS))
    assert b"get_weather" in body
    assert b"get_time" not in body
