"""Frames around the content: ``nvext.annotations`` before an SSE stream; a settled reasoning
parser leaves plain bytes."""

from __future__ import annotations

from typing import Any

import msgspec

from services.formatter.request import RequestFormatter
from tests.unit.formatter.test_request_timing import feed, timed_open

NOTES = (("request_id", '"r1"'), ("token_ids", "[1,2,3]"))


def test_annotations_open_the_stream_as_event_frames(tokenizer: Any) -> None:
    open_ = msgspec.structs.replace(timed_open(stream=True), annotations=NOTES)
    out = feed(RequestFormatter(open_, tokenizer, now=0), [0.1, 0.2])
    head = b'event: request_id\n: "r1"\n\nevent: token_ids\n: [1,2,3]\n\ndata: {'
    assert out.startswith(head)
    assert out.count(b"event: ") == 2  # once, not per batch
    assert out.endswith(b"data: [DONE]\n\n")


def test_no_frames_without_a_stream_or_for_grpc_text(tokenizer: Any) -> None:
    body = msgspec.structs.replace(timed_open(), annotations=NOTES)
    assert b"event:" not in feed(RequestFormatter(body, tokenizer, now=0), [0.1])
    text = msgspec.structs.replace(timed_open(stream=True, format="text"), annotations=NOTES)
    assert b"event:" not in feed(RequestFormatter(text, tokenizer, now=0), [0.1])


def test_a_plain_answer_under_a_reasoning_parser_streams_the_same_bytes(tokenizer: Any) -> None:
    """Plain chats get the qwen3 parser (a real Qwen3 may think); once it has settled, the
    choice takes the plain fast path, byte for byte what a parser-less request gives."""
    plain = feed(RequestFormatter(timed_open(stream=True), tokenizer, now=0), [0.1, 0.2, 0.3])
    parsed_open = timed_open(stream=True, reasoning_parser="qwen3")
    parsed = RequestFormatter(parsed_open, tokenizer, now=0)
    assert feed(parsed, [0.1, 0.2, 0.3]) == plain
    assert parsed._choices[0].plain  # settled: no more parsing
