"""``AnthropicShaper``: golden Messages bodies and stream events for a fixed sequence of pieces,
each checked against the ``anthropic`` SDK's own types (what its clients parse)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from services.formatter.pieces import (
    ChoiceEnd,
    ChoiceResult,
    Collected,
    Content,
    Piece,
    Reasoning,
    ToolCallArgs,
    ToolCallStart,
)
from services.formatter.shapers import shaper_for
from services.formatter.shapers.anthropic import AnthropicShaper, signature
from services.formatter.shaping import usage
from shared.messages import OutputOptions, StreamOpen

OPEN = StreamOpen(
    request_id="r1",
    api="chat",
    model="qwen",
    reply_to="reply",
    created=100,
    prompt_tokens=10,
    output=OutputOptions(stream=True, format="anthropic"),
    max_tokens=50,
)
PIECES: list[Piece] = [
    Reasoning("Think "),
    Reasoning("more."),
    Content("Hi"),
    Content(" there"),
    ToolCallStart(0, "call_abc", "get_weather"),
    ToolCallArgs(0, '{"city": '),
    ToolCallArgs(0, '"Paris"}'),
]
USAGE = usage(10, 7, 4)
EVENTS = TypeAdapter(RawMessageStreamEvent)


def _events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, data)`` per SSE event; the name always equals the data's ``type``."""
    out = []
    for frame in data.decode().split("\n\n"):
        if not frame:
            continue
        name_line, data_line = frame.split("\n")
        name = name_line.removeprefix("event: ")
        payload = msgspec.json.decode(data_line.removeprefix("data: "))
        assert payload["type"] == name
        out.append((name, payload))
    return out


def _stream(pieces: list[Piece], end: ChoiceEnd) -> bytes:
    shaper = AnthropicShaper(OPEN)
    data = shaper.opening()
    # One batch per piece, as a stream that delivers one token at a time.
    for piece in pieces:
        data += shaper.delta(0, [piece])
    data += shaper.choice_end(0, end)
    return data + shaper.closing(USAGE)


def test_shaper_for_picks_it() -> None:
    assert isinstance(shaper_for(OPEN), AnthropicShaper)


def test_stream_golden_events() -> None:
    events = _events(_stream(PIECES, ChoiceEnd("stop", has_tool_calls=True)))

    def delta(index: int, **delta: Any) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {
            "type": "content_block_delta",
            "index": index,
            "delta": delta,
        }

    def start(index: int, **block: Any) -> tuple[str, dict[str, Any]]:
        payload = {"type": "content_block_start", "index": index, "content_block": block}
        return "content_block_start", payload

    def stop(index: int) -> tuple[str, dict[str, Any]]:
        return "content_block_stop", {"type": "content_block_stop", "index": index}

    assert events == [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_r1",
                    "type": "message",
                    "role": "assistant",
                    "model": "qwen",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 10,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                        "output_tokens": 0,
                    },
                },
            },
        ),
        ("ping", {"type": "ping"}),
        start(0, type="thinking", thinking="", signature=""),
        delta(0, type="thinking_delta", thinking="Think "),
        delta(0, type="thinking_delta", thinking="more."),
        delta(0, type="signature_delta", signature=signature("Think more.")),
        stop(0),
        start(1, type="text", text=""),
        delta(1, type="text_delta", text="Hi"),
        delta(1, type="text_delta", text=" there"),
        stop(1),
        start(2, type="tool_use", id="toolu_abc", name="get_weather", input={}),
        delta(2, type="input_json_delta", partial_json='{"city": '),
        delta(2, type="input_json_delta", partial_json='"Paris"}'),
        stop(2),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {
                    "input_tokens": 6,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 4,
                    "output_tokens": 7,
                },
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_every_stream_event_parses_as_the_sdk_type() -> None:
    data = _stream(PIECES, ChoiceEnd("stop", has_tool_calls=True))
    for name, payload in _events(data):
        if name != "ping":
            EVENTS.validate_python(payload)


def test_stream_and_body_agree_through_the_sdk_accumulator() -> None:
    from anthropic.lib.streaming._messages import accumulate_event

    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for name, payload in _events(_stream(PIECES, ChoiceEnd("stop", has_tool_calls=True))):
        if name == "ping":
            continue
        event = EVENTS.validate_python(payload)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    body = _body(PIECES, ChoiceEnd("stop", has_tool_calls=True))
    assert snapshot is not None
    assert Message.model_validate(snapshot.model_dump()) == Message.model_validate(body)


def _body(pieces: list[Piece], end: ChoiceEnd) -> dict[str, Any]:
    collected = Collected()
    collected.add(pieces)
    data = AnthropicShaper(OPEN).body([ChoiceResult(0, collected, end)], USAGE)
    decoded: dict[str, Any] = msgspec.json.decode(data)
    return decoded


def test_body_golden() -> None:
    body = _body(PIECES, ChoiceEnd("stop", has_tool_calls=True))
    assert body == {
        "id": "msg_r1",
        "type": "message",
        "role": "assistant",
        "model": "qwen",
        "content": [
            {"type": "thinking", "thinking": "Think more.", "signature": signature("Think more.")},
            {"type": "text", "text": "Hi there"},
            {
                "type": "tool_use",
                "id": "toolu_abc",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 6,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 4,
            "output_tokens": 7,
        },
    }
    Message.model_validate(body)


@pytest.mark.parametrize(
    ("end", "reason", "sequence"),
    [
        (ChoiceEnd("stop"), "end_turn", None),
        (ChoiceEnd("length"), "max_tokens", None),
        (ChoiceEnd("length", has_tool_calls=True), "max_tokens", None),
        (ChoiceEnd("stop", stop_string="END"), "stop_sequence", "END"),
        (ChoiceEnd("stop", has_tool_calls=True), "tool_use", None),
    ],
)
def test_stop_reasons(end: ChoiceEnd, reason: str, sequence: str | None) -> None:
    body = _body([Content("x")], end)
    assert (body["stop_reason"], body["stop_sequence"]) == (reason, sequence)
    events = _events(_stream([Content("x")], end))
    assert events[-2][1]["delta"] == {"stop_reason": reason, "stop_sequence": sequence}


def test_a_failed_generation_ends_with_an_error_event() -> None:
    events = _events(_stream([Content("x")], ChoiceEnd("error")))
    assert [name for name, _ in events][-2:] == ["content_block_stop", "error"]
    assert events[-1][1]["error"]["type"] == "api_error"


def test_an_empty_answer_has_no_content_block() -> None:
    events = _events(_stream([Content("")], ChoiceEnd("stop")))
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "message_delta",
        "message_stop",
    ]
    assert _body([], ChoiceEnd("stop"))["content"] == []
