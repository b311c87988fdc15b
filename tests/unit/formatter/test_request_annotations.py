"""``nvext.annotations``: ``event:`` frames before the first chunk of an SSE stream only."""

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
