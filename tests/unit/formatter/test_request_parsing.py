"""Per choice, detokenized text goes through the reasoning parser, then the tool parser; the
pieces reach the shaper. The parsers here are small fakes (the real ones have their own tests):
what is checked is the wiring, with the real tokenizer's ``<think>`` / ``<tool_call>`` tokens."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.formatter import choice
from services.formatter.pieces import (
    Content,
    Piece,
    Reasoning,
    TextPiece,
    ToolCallArgs,
    ToolCallStart,
    ToolPiece,
    tidy,
)
from services.formatter.request import RequestFormatter
from shared.messages import (
    Api,
    OutputOptions,
    StreamOpen,
    TokenBatch,
)
from tests.unit.formatter.test_shapers_openai_chat import payloads

OUTPUT = (
    '<think>\nPlan it.\n</think>\n\nSure.<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Paris"}}\n</tool_call>'
)


class FakeReasoning:
    """``<think>`` / ``</think>`` whole within one push (single tokens in Qwen3)."""

    settled = False  # it may always meet another <think>

    def __init__(self, opened: bool) -> None:
        self.inside = opened

    def push(self, text: str) -> list[TextPiece]:
        out: list[TextPiece] = []
        while text:
            head, sep, text = text.partition("</think>" if self.inside else "<think>")
            if head:
                out.append(Reasoning(head) if self.inside else Content(head))
            if sep:
                self.inside = not self.inside
        return out

    def flush(self) -> list[TextPiece]:
        return []


class FakeTools:
    """``<tool_call>{json}</tool_call>``: a call's pieces once its closing tag came."""

    def __init__(self) -> None:
        self.buf = ""
        self.inside = False
        self.calls = 0

    def push(self, text: str) -> list[ToolPiece]:
        out: list[ToolPiece] = []
        self.buf += text
        while self.buf:
            if not self.inside:
                head, sep, self.buf = self.buf.partition("<tool_call>")
                if head:
                    out.append(Content(head))
                self.inside = bool(sep)
                continue
            body, sep, rest = self.buf.partition("</tool_call>")
            if not sep:
                break
            call, n = json.loads(body), self.calls
            out += [
                ToolCallStart(n, f"call_{n}", call["name"]),
                ToolCallArgs(n, json.dumps(call["arguments"])),
            ]
            self.calls, self.buf, self.inside = n + 1, rest, False
        return out

    def flush(self) -> list[ToolPiece]:
        left, self.buf = self.buf, ""
        return [Content("<tool_call>" + left)] if self.inside else []


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Fake parser factories; returns the tools each tool parser was made with."""
    seen_tools: list[Any] = []

    def reasoning_for(out: OutputOptions) -> FakeReasoning | None:
        return FakeReasoning(out.reasoning_open) if out.reasoning_parser else None

    def tools_for(open_: StreamOpen) -> FakeTools | None:
        seen_tools.append(open_.tools)
        return FakeTools() if open_.output.tool_parser else None

    monkeypatch.setattr(choice, "reasoning_parser_for", reasoning_for)
    monkeypatch.setattr(choice, "tool_parser_for", tools_for)
    return seen_tools


def parsing_open(api: Api = "chat", **output: Any) -> StreamOpen:
    return StreamOpen(
        request_id="r1",
        api=api,
        model="m",
        reply_to="gw",
        created=1,
        prompt_tokens=4,
        output=OutputOptions(reasoning_parser="qwen3", tool_parser="hermes", **output),
        max_tokens=64,
    )


def one_token_batches(tokenizer: Any, text: str, finish: str = "stop") -> list[TokenBatch]:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return [
        TokenBatch(
            request_id="r1",
            token_ids=(token_id,),
            index=n,
            finish_reason=finish if n == len(ids) - 1 else None,  # type: ignore[arg-type]
        )
        for n, token_id in enumerate(ids)
    ]


def run(fmt: RequestFormatter, items: list[TokenBatch]) -> bytes:
    return b"".join(fmt.on_batch(b, now=0.0) for b in items)


def test_streaming_reasoning_content_and_a_tool_call(tokenizer: Any, fakes: list[Any]) -> None:
    fmt = RequestFormatter(parsing_open(stream=True), tokenizer, now=0)
    objects = payloads(run(fmt, one_token_batches(tokenizer, OUTPUT)))
    deltas = [o["choices"][0]["delta"] for o in objects[:-1]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert (reasoning, content) == ("\nPlan it.\n", "\n\nSure.")
    assert calls[0] == {
        "index": 0,
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Paris"}
    assert objects[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert fmt.finish_reason == "stop"


def test_non_streaming_message_has_reasoning_and_tool_calls(
    tokenizer: Any, fakes: list[Any]
) -> None:
    fmt = RequestFormatter(parsing_open(), tokenizer, now=0)
    choice = json.loads(run(fmt, one_token_batches(tokenizer, OUTPUT)))["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "\n\nSure.",
        "reasoning_content": "\nPlan it.\n",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }


def test_a_prompt_that_opened_the_block_starts_in_reasoning(
    tokenizer: Any, fakes: list[Any]
) -> None:
    fmt = RequestFormatter(parsing_open(reasoning_open=True), tokenizer, now=0)
    message = json.loads(run(fmt, one_token_batches(tokenizer, "Hmm.</think>Yes.")))
    assert message["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Yes.",
        "reasoning_content": "Hmm.",
    }


def test_an_unfinished_call_is_given_back_as_content(tokenizer: Any, fakes: list[Any]) -> None:
    fmt = RequestFormatter(parsing_open(), tokenizer, now=0)
    text = 'Hi<tool_call>\n{"name": "f"'
    body = json.loads(run(fmt, one_token_batches(tokenizer, text, finish="length")))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": text}
    assert body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("api", "fmt"), [("completion", "openai"), ("chat", "text"), ("chat", "kserve")]
)
def test_no_parsing_for_completions_or_grpc_text(
    tokenizer: Any, fakes: list[Any], api: Api, fmt: str
) -> None:
    formatter = RequestFormatter(parsing_open(api, format=fmt), tokenizer, now=0)
    assert fakes == []  # no tool parser was made
    body = run(formatter, one_token_batches(tokenizer, "<think>x</think>y"))
    assert b"<think>x</think>y" in body


def test_the_tool_parser_gets_the_requests_function_definitions(
    tokenizer: Any, fakes: list[Any]
) -> None:
    tool = {"name": "get_weather", "parameters": {"type": "object"}}
    open_ = parsing_open(n=2)
    RequestFormatter(StreamOpen(**{**_fields(open_), "tools": (tool,)}), tokenizer, now=0)
    assert fakes == [(tool,), (tool,)]  # one parser per choice


def _fields(open_: StreamOpen) -> dict[str, Any]:
    return {f: getattr(open_, f) for f in open_.__struct_fields__}


def test_tidy_joins_neighbours_and_drops_empty_text() -> None:
    pieces: list[Piece] = [
        Content("a"),
        Content(""),
        Content("b"),
        Reasoning("r"),
        ToolCallStart(0, "c0", "f"),
        ToolCallArgs(0, "{"),
        ToolCallArgs(0, "}"),
        ToolCallStart(1, "c1", "g"),
        ToolCallArgs(1, "{}"),
    ]
    assert tidy(pieces) == [
        Content("ab"),
        Reasoning("r"),
        ToolCallStart(0, "c0", "f"),
        ToolCallArgs(0, "{}"),
        ToolCallStart(1, "c1", "g"),
        ToolCallArgs(1, "{}"),
    ]


def test_the_real_parser_registry_parses_reasoning_and_a_tool_call(tokenizer: Any) -> None:
    fmt = RequestFormatter(parsing_open(), tokenizer, now=0)
    choice = json.loads(run(fmt, one_token_batches(tokenizer, OUTPUT)))["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert choice["message"]["reasoning_content"].strip() == "Plan it."
