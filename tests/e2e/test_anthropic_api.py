"""The Anthropic Messages API end to end: every service a process, the official ``anthropic``
client (``/v1/messages``, streaming and not, tools, ``count_tokens``, errors)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest

from services.cli.stack import Stack
from tests.e2e.conftest import MODEL

MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about the sea."}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}


@pytest.fixture
async def claude(stack: Stack) -> AsyncIterator[anthropic.AsyncAnthropic]:
    c = anthropic.AsyncAnthropic(base_url=stack.base_url, api_key="unused", max_retries=0)
    try:
        yield c
    finally:
        await c.close()


async def test_non_streaming_message_has_text_usage_and_max_tokens_stop(
    claude: anthropic.AsyncAnthropic,
) -> None:
    message = await claude.messages.create(
        model=MODEL, max_tokens=12, messages=MESSAGES, system="You are terse."
    )
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.id.startswith("msg_")
    assert message.model == MODEL
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].type == "text"
    assert message.content[0].text
    assert message.stop_reason == "max_tokens"
    assert message.stop_sequence is None
    assert message.usage.output_tokens == 12
    cached = message.usage.cache_read_input_tokens or 0
    assert message.usage.input_tokens + cached > 10


async def test_streaming_events_come_in_anthropic_order_and_match_the_body(
    claude: anthropic.AsyncAnthropic,
) -> None:
    whole = await claude.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)
    stream = await claude.messages.create(
        model=MODEL, max_tokens=10, messages=MESSAGES, stream=True
    )
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start"
    assert kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert whole.content[0].type == "text"
    assert text == whole.content[0].text
    delta = events[-2]
    assert delta.type == "message_delta"
    assert delta.delta.stop_reason == "max_tokens"
    assert delta.usage.output_tokens == 10


async def test_stream_helper_assembles_the_final_message(claude: anthropic.AsyncAnthropic) -> None:
    async with claude.messages.stream(model=MODEL, max_tokens=8, messages=MESSAGES) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert final.content[0].type == "text"
    assert "".join(texts) == final.content[0].text
    assert final.usage.output_tokens == 8


async def test_tool_choice_any_returns_a_tool_use_block_with_an_input_object(
    claude: anthropic.AsyncAnthropic,
) -> None:
    message = await claude.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "any"},
    )
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses, f"no tool_use block for tool_choice=any: {message.content!r}"
    assert message.stop_reason == "tool_use"
    use = uses[0]
    assert use.id.startswith("toolu_")
    assert use.name == "get_weather"
    assert isinstance(use.input, dict)
    assert isinstance(use.input["city"], str)
    # The call goes back as a tool_result and renders through the chat template.
    follow = await claude.messages.create(
        model=MODEL,
        max_tokens=8,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": message.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}],
            },
        ],
    )
    assert follow.content


async def test_streamed_tool_use_reassembles_to_the_same_input(
    claude: anthropic.AsyncAnthropic,
) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    whole = await claude.messages.create(**kwargs)
    assert any(b.type == "tool_use" for b in whole.content), whole.content
    async with claude.messages.stream(**kwargs) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == [b.type for b in whole.content]
    streamed = [b for b in final.content if b.type == "tool_use"]
    expected = [b for b in whole.content if b.type == "tool_use"]
    assert [b.input for b in streamed] == [b.input for b in expected]
    assert final.stop_reason == "tool_use"


async def test_count_tokens_counts_what_generation_reports(
    claude: anthropic.AsyncAnthropic,
) -> None:
    message = await claude.messages.create(
        model=MODEL, max_tokens=1, messages=MESSAGES, system="Be brief."
    )
    count = await claude.messages.count_tokens(model=MODEL, messages=MESSAGES, system="Be brief.")
    cached = message.usage.cache_read_input_tokens or 0
    assert count.input_tokens == message.usage.input_tokens + cached
    with_tools = await claude.messages.count_tokens(
        model=MODEL,
        messages=MESSAGES,
        system="Be brief.",
        tools=[WEATHER],
    )
    assert with_tools.input_tokens > count.input_tokens


async def test_unknown_model_is_not_found_in_anthropic_shape(
    claude: anthropic.AsyncAnthropic, stack: Stack
) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        await claude.messages.create(model="no-such-model", max_tokens=4, messages=MESSAGES)
    assert info.value.status_code == 404
    body = info.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert info.value.request_id
    with pytest.raises(anthropic.NotFoundError):
        await claude.messages.count_tokens(model="no-such-model", messages=MESSAGES)


async def test_bad_request_is_400_invalid_request_error(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        resp = await http.post("/v1/messages", json={"model": MODEL, "messages": MESSAGES})
    assert resp.status_code == 400
    assert resp.headers["request-id"] == resp.headers["x-request-id"]
    body = resp.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


async def test_thinking_comes_back_as_a_signed_thinking_block_in_both_modes(
    claude: anthropic.AsyncAnthropic,
) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 2048,
        "messages": MESSAGES,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    message = await claude.messages.create(**kwargs)
    kinds = [b.type for b in message.content]
    assert kinds[:1] == ["thinking"], kinds
    block = message.content[0]
    assert block.type == "thinking"
    assert block.thinking
    assert block.signature
    async with claude.messages.stream(**kwargs) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == kinds
    assert final.content[0] == block
    off = await claude.messages.create(
        model=MODEL, max_tokens=64, messages=MESSAGES, thinking={"type": "disabled"}
    )
    assert "thinking" not in [b.type for b in off.content]


async def test_a_stop_sequence_is_named_in_both_modes(claude: anthropic.AsyncAnthropic) -> None:
    full = await claude.messages.create(model=MODEL, max_tokens=40, messages=MESSAGES)
    assert full.content[0].type == "text"
    text = full.content[0].text
    stop = text.split()[5]
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 40,
        "messages": MESSAGES,
        "stop_sequences": ["no such words here", stop],
    }
    cut = await claude.messages.create(**kwargs)
    assert cut.stop_reason == "stop_sequence"
    assert cut.stop_sequence == stop
    assert cut.content[0].type == "text"
    assert cut.content[0].text == text[: text.index(stop)]
    async with claude.messages.stream(**kwargs) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "stop_sequence"
    assert final.stop_sequence == stop
    assert final.content[0].type == "text"
    assert final.content[0].text == cut.content[0].text
