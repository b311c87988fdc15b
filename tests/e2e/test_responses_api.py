"""The OpenAI Responses API end to end (``/v1/responses``; stored turns are in
test_responses_state.py): every service a process, the official ``openai`` client, streaming
and not, with a function tool; every object and event as the wire carries it checked against
the OpenResponses schema."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from services.cli.stack import Stack
from tests.contract.openresponses import (
    WITH_RESPONSE,
    event_errors,
    missing_required,
    response_errors,
)
from tests.e2e.conftest import MODEL

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def _collapsed(kinds: list[str]) -> list[str]:
    """Event types with runs of the same delta type collapsed to one."""
    out: list[str] = []
    for kind in kinds:
        if not (out and out[-1] == kind and kind.endswith(".delta")):
            out.append(kind)
    return out


async def test_non_streaming_response_has_a_message_and_usage(
    client: openai.AsyncOpenAI,
) -> None:
    resp = await client.responses.create(
        model=MODEL,
        input="Tell me about the sea.",
        instructions="Be brief.",
        max_output_tokens=20,
        reasoning={"effort": "none"},
    )
    assert resp.object == "response"
    assert resp.id.startswith("resp_")
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in resp.output] == ["message"]
    assert resp.output_text
    assert resp.usage is not None
    assert resp.usage.output_tokens == 20
    assert resp.usage.total_tokens == resp.usage.input_tokens + 20


async def test_streaming_events_follow_the_documented_order(client: openai.AsyncOpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "input": [{"role": "user", "content": "Tell me about the sea."}],
        "max_output_tokens": 16,
        "reasoning": {"effort": "none"},
    }
    whole = await client.responses.create(**kwargs)
    stream = await client.responses.create(**kwargs, stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert _collapsed(kinds) == [*TEXT_EVENTS, "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.output_text == text
    assert last.response.usage is not None
    assert last.response.usage.output_tokens == 16


async def test_a_required_function_tool_is_called_in_both_modes(
    client: openai.AsyncOpenAI,
) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "input": "What is the weather in Paris?",
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_output_tokens": 200,
        "reasoning": {"effort": "none"},
    }
    resp = await client.responses.create(**kwargs)
    calls = [item for item in resp.output if item.type == "function_call"]
    assert calls, f"no function_call item for tool_choice=required: {resp.output!r}"
    assert resp.status == "completed"
    call = calls[0]
    assert call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)
    stream = await client.responses.create(**kwargs, stream=True)
    events = [e async for e in stream]
    kinds = _collapsed([e.type for e in events])
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-1] == "response.completed"
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert [d.arguments for d in done] == [deltas]
    assert json.loads(deltas) == json.loads(call.arguments)
    # The call and its output go back as input items (stateless round trip).
    items: Any = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
    ]
    follow = await client.responses.create(
        model=MODEL,
        input=items,
        tools=[WEATHER],
        max_output_tokens=16,
        reasoning={"effort": "none"},
    )
    assert follow.output_text


async def test_unknown_previous_response_id_and_unknown_model_are_refused(
    client: openai.AsyncOpenAI, stack: Stack
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model=MODEL, input="hi", previous_response_id="resp_x")
    assert bad.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="no-such-model", input="hi")
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        resp = await http.post("/v1/responses", json={"model": MODEL})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "input"


async def test_reasoning_comes_back_as_a_reasoning_item_first(client: openai.AsyncOpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "input": "Tell me about the sea.",
        "max_output_tokens": 2048,
        "reasoning": {"effort": "medium"},
    }
    resp = await client.responses.create(**kwargs)
    kinds = [item.type for item in resp.output]
    assert kinds[:1] == ["reasoning"], kinds
    item = resp.output[0]
    assert item.type == "reasoning"
    assert item.content
    assert item.content[0].text
    stream = await client.responses.create(**kwargs, stream=True)
    events = [e async for e in stream]
    kinds_streamed = _collapsed([e.type for e in events])
    assert kinds_streamed[2:6] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
    ]
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert done[0].text == item.content[0].text


async def test_the_sdk_stream_helper_accumulates_the_final_response(
    client: openai.AsyncOpenAI,
) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "input": "What is the weather in Paris?",
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_output_tokens": 400,
        "reasoning": {"effort": "medium"},
    }
    whole = await client.responses.create(**kwargs)
    async with client.responses.stream(**kwargs) as stream:
        texts = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(texts) == final.output_text == whole.output_text
    assert [item.type for item in final.output] == [item.type for item in whole.output]
    assert final.status == whole.status
    assert final.usage == whole.usage

    def without_ids(response: Any) -> list[dict[str, Any]]:
        items = [item.model_dump() for item in response.output]
        return [
            {k: v for k, v in i.items() if k not in ("id", "call_id", "parsed_arguments")}
            for i in items
        ]

    assert without_ids(final) == without_ids(whole)


ECHOED = {
    "presence_penalty": 0.5,
    "frequency_penalty": 0.25,
    "safety_identifier": "user-7",
    "prompt_cache_key": "shared-prefix",
}
"""Request fields the OpenResponses schema requires the response to repeat."""
SCHEMA_REQUESTS: dict[str, dict[str, Any]] = {
    "cut-by-the-token-limit": {"input": "Tell me about the sea.", "max_output_tokens": 16},
    "a-required-tool-call": {
        "input": "What is the weather in Paris?",
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_output_tokens": 200,
    },
}


@pytest.mark.parametrize("fields", SCHEMA_REQUESTS.values(), ids=SCHEMA_REQUESTS.keys())
async def test_every_response_object_meets_the_openresponses_schema(
    client: openai.AsyncOpenAI, fields: dict[str, Any]
) -> None:
    """The body, and every streamed event (each ``response`` they carry included), as sent."""
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "reasoning": {"effort": "none"},
        "safety_identifier": ECHOED["safety_identifier"],
        "prompt_cache_key": ECHOED["prompt_cache_key"],
        # Not in the SDK's signature (OpenAI's API has no penalties here; OpenResponses has).
        "extra_body": {k: ECHOED[k] for k in ("presence_penalty", "frequency_penalty")},
        **fields,
    }
    raw = await client.responses.with_raw_response.create(**kwargs)
    body = json.loads(raw.content)
    async with client.responses.with_streaming_response.create(**kwargs, stream=True) as sent:
        lines = [line async for line in sent.iter_lines()]
    events = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data:")]
    responses = [body, *(e["response"] for e in events if e["type"] in WITH_RESPONSE)]
    assert [e["type"] for e in events if e["type"] in WITH_RESPONSE][:2] == [
        "response.created",
        "response.in_progress",
    ]
    assert len(responses) == 4
    assert [missing_required(r) for r in responses] == [[]] * 4
    assert [response_errors(r) for r in responses] == [[]] * 4
    assert [error for e in events for error in event_errors(e)] == []
    assert [{k: r[k] for k in ECHOED} for r in responses] == [ECHOED] * 4
