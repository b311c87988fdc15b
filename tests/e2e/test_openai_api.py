"""The OpenAI API end to end: every service a process, the official ``openai`` client."""

from __future__ import annotations

import httpx
import openai
import pytest

from services.cli.stack import Stack
from tests.e2e.conftest import MODEL

CHAT = [{"role": "user", "content": "Tell me about the sea."}]


async def test_streaming_chat_yields_chunks_usage_and_length_finish(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text.strip()
    assert finishes[-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens > 5
    assert chunks[-1].usage.prompt_tokens_details is not None
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens is not None


async def test_streaming_without_include_usage_sends_no_usage_chunk(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4, stream=True
    )
    chunks = [c async for c in stream]
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


async def test_non_streaming_chat_counts_tokens_and_stops_at_max_tokens(
    client: openai.AsyncOpenAI,
) -> None:
    resp = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 12
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 12


async def test_same_request_gives_the_same_text(client: openai.AsyncOpenAI) -> None:
    a = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    b = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    assert a.choices[0].message.content == b.choices[0].message.content


async def test_completions_stream_and_non_stream(client: openai.AsyncOpenAI) -> None:
    resp = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6)
    assert resp.object == "text_completion"
    assert resp.choices[0].text
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 6
    stream = await client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, stream=True
    )
    parts = [c async for c in stream]
    assert "".join(c.choices[0].text for c in parts if c.choices) == resp.choices[0].text
    assert parts[-1].choices[0].finish_reason == "length"


async def test_stop_string_truncates_before_it_and_is_not_leaked(
    client: openai.AsyncOpenAI,
) -> None:
    full = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40)
    text = full.choices[0].message.content or ""
    words = text.split()
    assert len(words) > 6
    stop = words[5]
    cut = text.index(stop)
    resp = await client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=40, stop=[stop]
    )
    assert resp.choices[0].message.content == text[:cut]
    assert resp.choices[0].finish_reason == "stop"
    stream = await client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=40, stop=[stop], stream=True
    )
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert streamed == text[:cut]


async def test_include_stop_str_in_output_keeps_the_stop_string(
    client: openai.AsyncOpenAI,
) -> None:
    full = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40)
    text = full.choices[0].message.content or ""
    stop = text.split()[5]
    cut = text.index(stop) + len(stop)
    resp = await client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=40,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert resp.choices[0].message.content == text[:cut]


async def test_eos_ends_generation_with_stop_and_ignore_eos_runs_to_max_tokens(
    client: openai.AsyncOpenAI,
) -> None:
    resp = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4000)
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None
    assert resp.usage.completion_tokens < 4000
    forced = await client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4000, extra_body={"ignore_eos": True}
    )
    assert forced.choices[0].finish_reason == "length"
    assert forced.usage is not None
    assert forced.usage.completion_tokens == 4000


async def test_models_lists_the_served_model(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]


async def test_chat_template_kwargs_reach_the_template(client: openai.AsyncOpenAI) -> None:
    plain = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    no_think = await client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=1,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert plain.usage is not None
    assert no_think.usage is not None
    # Qwen3's template appends an empty <think></think> block when thinking is off.
    assert no_think.usage.prompt_tokens > plain.usage.prompt_tokens


# --- errors -----------------------------------------------------------------------------------


async def test_unknown_model_is_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="no-such-model", messages=CHAT)
    assert info.value.status_code == 404


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": 5},
        {"top_p": 0},
        {"max_tokens": 0},
        {"max_tokens": "many"},
        {"messages": []},
        {"messages": "hello"},
    ],
    ids=["temperature", "top_p", "max_tokens-zero", "max_tokens-type", "empty", "type"],
)
async def test_bad_parameters_are_400_with_an_openai_body(stack: Stack, extra: dict) -> None:
    body = {"model": MODEL, "messages": CHAT, **extra}
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        resp = await http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["message"]
    assert error["type"] == "invalid_request_error"
    assert "code" in error


async def test_malformed_json_is_400(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        resp = await http.post(
            "/v1/chat/completions",
            content=b'{"model": "x", "messages": [',
            headers={"content-type": "application/json"},
        )
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"


async def test_context_length_exceeded_is_400_naming_the_limit(
    client: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=50000)
    assert "40960" in str(info.value)


async def test_health_and_live(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/live")).status_code == 200
