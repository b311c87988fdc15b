"""``ResponsesShaper``: golden Responses bodies and stream events for a fixed sequence of pieces,
each checked against the ``openai`` SDK's own types (what its clients parse) and the
OpenResponses schema (what clients that validate accept)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from services.formatter.pieces import (
    ChoiceEnd,
    ChoiceResult,
    Collected,
    Content,
    Piece,
    Reasoning,
    TokenLogprobs,
    ToolCallArgs,
    ToolCallStart,
    TopLogprob,
)
from services.formatter.shapers import shaper_for
from services.formatter.shapers.responses import ResponsesShaper
from services.formatter.shaping import usage
from shared.messages import OutputOptions, StreamOpen
from tests.contract.openresponses import (
    WITH_RESPONSE,
    event_errors,
    missing_required,
    response_errors,
)

OPEN = StreamOpen(
    request_id="r1",
    api="chat",
    model="qwen",
    reply_to="reply",
    created=100,
    prompt_tokens=10,
    output=OutputOptions(stream=True, format="responses"),
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
EVENTS = TypeAdapter(ResponseStreamEvent)
REASONING = {
    "id": "rs_r1_0",
    "type": "reasoning",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "Think more."}],
    "status": "completed",
}
MESSAGE = {
    "id": "msg_r1_1",
    "type": "message",
    "status": "completed",
    "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Hi there"}],
    "role": "assistant",
}
CALL = {
    "id": "fc_abc",
    "type": "function_call",
    "status": "completed",
    "arguments": '{"city": "Paris"}',
    "call_id": "call_abc",
    "name": "get_weather",
}
USAGE_JSON = {
    "input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 17,
}


def _events(data: bytes) -> list[dict[str, Any]]:
    out = []
    for frame in data.decode().split("\n\n"):
        if not frame:
            continue
        name_line, data_line = frame.split("\n")
        payload = msgspec.json.decode(data_line.removeprefix("data: "))
        assert payload["type"] == name_line.removeprefix("event: ")
        out.append(payload)
    return out


def _stream(
    pieces: list[Piece], end: ChoiceEnd, logprobs: list[TokenLogprobs] | None = None
) -> bytes:
    logprobs = logprobs or []
    shaper = ResponsesShaper(OPEN)
    data = shaper.opening()
    for i, piece in enumerate(pieces):
        data += shaper.delta(0, [piece], logprobs[i : i + 1])
    data += shaper.choice_end(0, end)
    return data + shaper.closing(USAGE)


def _body(
    pieces: list[Piece], end: ChoiceEnd, logprobs: list[TokenLogprobs] | None = None
) -> dict[str, Any]:
    collected = Collected()
    collected.add(pieces)
    data = ResponsesShaper(OPEN).body([ChoiceResult(0, collected, end, logprobs)], USAGE)
    decoded: dict[str, Any] = msgspec.json.decode(data)
    return decoded


def test_shaper_for_picks_it() -> None:
    assert isinstance(shaper_for(OPEN), ResponsesShaper)


def test_stream_golden_event_sequence() -> None:
    events = _events(_stream(PIECES, ChoiceEnd("stop", has_tool_calls=True)))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    assert events[9] == {
        "type": "response.output_item.added",
        "output_index": 1,
        "item": {
            "id": "msg_r1_1",
            "type": "message",
            "status": "in_progress",
            "content": [],
            "role": "assistant",
        },
        "sequence_number": 9,
    }
    assert events[11] == {
        "type": "response.output_text.delta",
        "item_id": "msg_r1_1",
        "output_index": 1,
        "content_index": 0,
        "delta": "Hi",
        "logprobs": [],
        "sequence_number": 11,
    }
    assert events[16]["item"] == {**CALL, "status": "in_progress", "arguments": ""}
    assert events[17] == {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_abc",
        "output_index": 2,
        "delta": '{"city": ',
        "sequence_number": 17,
    }
    assert events[19]["arguments"] == CALL["arguments"]
    assert [events[i]["item"] for i in (8, 15, 20)] == [REASONING, MESSAGE, CALL]
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"] == [REASONING, MESSAGE, CALL]
    assert final["usage"] == USAGE_JSON


def test_every_stream_event_parses_as_the_sdk_type() -> None:
    for payload in _events(_stream(PIECES, ChoiceEnd("stop", has_tool_calls=True))):
        EVENTS.validate_python(payload)


def test_body_golden() -> None:
    body = _body(PIECES, ChoiceEnd("stop", has_tool_calls=True))
    assert body["id"] == "resp_r1"
    assert body["object"] == "response"
    assert body["created_at"] == 100
    assert body["status"] == "completed"
    assert body["incomplete_details"] is None
    assert body["model"] == "qwen"
    assert body["store"] is False
    assert body["output"] == [REASONING, MESSAGE, CALL]
    assert body["usage"] == USAGE_JSON
    response = Response.model_validate(body)
    assert response.output_text == "Hi there"


def test_a_length_cut_is_incomplete_in_both_modes() -> None:
    body = _body([Content("Hi")], ChoiceEnd("length"))
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    events = _events(_stream([Content("Hi")], ChoiceEnd("length")))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["item"]["status"] == "incomplete"
    for payload in events:
        EVENTS.validate_python(payload)


def test_a_failed_generation_ends_with_response_failed() -> None:
    events = _events(_stream([Content("Hi")], ChoiceEnd("error")))
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    EVENTS.validate_python(events[-1])


def test_logprobs_go_on_the_text_deltas_and_the_finished_part() -> None:
    lp = [
        TokenLogprobs("Hi", -0.5, (72, 105), (TopLogprob("Hi", -0.5, (72, 105)),)),
        TokenLogprobs(" there", -1.0, (32,), ()),
    ]
    events = _events(_stream([Content("Hi"), Content(" there")], ChoiceEnd("stop"), lp))
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas[0]["logprobs"] == [
        {"token": "Hi", "logprob": -0.5, "top_logprobs": [{"token": "Hi", "logprob": -0.5}]}
    ]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"][1] == {
        "token": " there",
        "bytes": [32],
        "logprob": -1.0,
        "top_logprobs": [],
    }
    for payload in events:
        EVENTS.validate_python(payload)
    body = _body([Content("Hi there")], ChoiceEnd("stop"), lp)
    assert body["output"][0]["content"][0]["logprobs"] == done["logprobs"]
    Response.model_validate(body)


class _EchoingOutput(OutputOptions, frozen=True, kw_only=True):
    """``OutputOptions`` with ``response_fields``, as the gateway sends it when it can."""

    response_fields: dict[str, Any] | None = None


def test_the_response_repeats_the_request_fields_it_was_given() -> None:
    echo = {"instructions": "Be brief.", "temperature": 0.2, "tools": [{"type": "function"}]}
    output = _EchoingOutput(stream=True, format="responses", response_fields=echo)
    shaper = ResponsesShaper(msgspec.structs.replace(OPEN, output=output))
    created = _events(shaper.opening())[0]["response"]
    assert {k: created[k] for k in echo} == echo
    assert list(created)[:4] == ["id", "object", "created_at", "status"]
    plain = _events(ResponsesShaper(OPEN).opening())[0]["response"]
    assert (plain["instructions"], plain["temperature"], plain["tools"]) == (None, 1.0, [])


ENDS = [ChoiceEnd("stop", has_tool_calls=True), ChoiceEnd("length"), ChoiceEnd("error")]


@pytest.mark.parametrize("end", ENDS, ids=lambda end: end.finish_reason)
def test_every_response_object_meets_the_openresponses_schema(end: ChoiceEnd) -> None:
    """Each event carrying a ``response`` (created, in_progress, the last) and the body."""
    events = _events(_stream(PIECES, end))
    carrying = [e for e in events if e["type"] in WITH_RESPONSE]
    assert len(carrying) == 3
    body = _body(PIECES, end)
    for response in [*(e["response"] for e in carrying), body]:
        assert missing_required(response) == []
        assert response_errors(response) == []
    assert [error for e in carrying for error in event_errors(e)] == []


def test_every_text_and_tool_call_event_meets_the_openresponses_schema() -> None:
    """Reasoning stays out: OpenAI names its events ``response.reasoning_text.*``, the
    OpenResponses schema ``response.reasoning.*``; the gateway speaks OpenAI's."""
    pieces: list[Piece] = [p for p in PIECES if not isinstance(p, Reasoning)]
    events = _events(_stream(pieces, ChoiceEnd("stop", has_tool_calls=True)))
    assert [error for e in events for error in event_errors(e)] == []


def test_the_response_repeats_penalties_and_the_ids_it_does_not_act_on() -> None:
    echo = {
        "presence_penalty": 0.5,
        "frequency_penalty": -0.25,
        "safety_identifier": "user-7",
        "prompt_cache_key": "shared-prefix",
    }
    output = _EchoingOutput(stream=True, format="responses", response_fields=echo)
    shaper = ResponsesShaper(msgspec.structs.replace(OPEN, output=output))
    created = _events(shaper.opening())[0]["response"]
    assert {k: created[k] for k in echo} == echo
    plain = _events(ResponsesShaper(OPEN).opening())[0]["response"]
    assert {k: plain[k] for k in echo} == {
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "safety_identifier": None,
        "prompt_cache_key": None,
    }
