"""Reasoning end to end with the official ``openai`` SDK: ``chat_template_kwargs.enable_thinking``
turns the mocker's ``<think>`` block on (decision 019: it thinks only when asked), and the
formatter's ``qwen3`` parser answers it as ``reasoning_content``, never inside ``content``,
whole and streamed (reasoning deltas first), also cut by ``max_tokens``, with ``n`` > 1 and
before a tool call."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.e2e.conftest import MODEL

ASK: list[Any] = [{"role": "user", "content": "Why is the sea salty?"}]
THINK: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": True}}
NO_THINK: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": False}}
TAGS = ("<think>", "</think>")


def reasoning_of(part: Any) -> str | None:
    """``reasoning_content`` of a message or delta (an extra field to the SDK's models)."""
    value = (part.model_extra or {}).get("reasoning_content")
    assert value is None or isinstance(value, str)
    return value


def assert_untagged(*texts: str | None) -> None:
    for text in texts:
        assert not any(tag in (text or "") for tag in TAGS), text


async def stream_parts(stream: Any) -> dict[int, list[tuple[str, str]]]:
    """Per choice index, the ordered ``("reasoning" | "content", text)`` pieces of a stream,
    the finish reason last as ``("finish", reason)``."""
    parts: dict[int, list[tuple[str, str]]] = {}
    async for chunk in stream:
        for choice in chunk.choices:
            seq = parts.setdefault(choice.index, [])
            if reasoning := reasoning_of(choice.delta):
                seq.append(("reasoning", reasoning))
            if choice.delta.content:
                seq.append(("content", choice.delta.content))
            if choice.finish_reason is not None:
                seq.append(("finish", choice.finish_reason))
    return parts


def joined(seq: list[tuple[str, str]], kind: str) -> str:
    return "".join(text for k, text in seq if k == kind)


async def test_enable_thinking_answers_reasoning_apart_from_content(
    client: openai.AsyncOpenAI,
) -> None:
    resp = await client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=60, extra_body=THINK
    )
    message = resp.choices[0].message
    reasoning = reasoning_of(message)
    assert reasoning
    assert reasoning.strip()
    assert message.content
    assert message.content.strip()
    assert_untagged(reasoning, message.content)
    assert reasoning == reasoning.strip()
    assert not message.content.startswith("\n")
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 60  # the reasoning tokens count as completion


async def test_streamed_reasoning_comes_first_and_matches_the_whole_answer(
    client: openai.AsyncOpenAI,
) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 60,
        "extra_body": THINK,
    }
    whole = (await client.chat.completions.create(**kwargs)).choices[0].message
    parts = await stream_parts(await client.chat.completions.create(**kwargs, stream=True))
    assert list(parts) == [0]
    seq = parts[0]
    kinds = [k for k, _ in seq]
    assert kinds[0] == "reasoning"
    assert kinds[-1] == "finish"
    assert seq[-1][1] == "length"
    first_content = kinds.index("content")
    assert set(kinds[:first_content]) == {"reasoning"}
    assert set(kinds[first_content:-1]) == {"content"}
    assert joined(seq, "reasoning") == reasoning_of(whole)
    assert joined(seq, "content") == whole.content


@pytest.mark.parametrize("extra", [NO_THINK, {}], ids=["enable_thinking-false", "plain"])
async def test_without_enable_thinking_there_is_no_reasoning(
    client: openai.AsyncOpenAI, extra: dict[str, Any]
) -> None:
    resp = await client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=30, extra_body=extra
    )
    message = resp.choices[0].message
    assert reasoning_of(message) is None
    assert message.content
    assert message.content.strip()
    assert_untagged(message.content)
    parts = await stream_parts(
        await client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=30, extra_body=extra, stream=True
        )
    )
    assert {k for k, _ in parts[0]} == {"content", "finish"}
    assert joined(parts[0], "content") == message.content


async def test_a_cut_inside_the_reasoning_is_all_reasoning(client: openai.AsyncOpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 5,
        "extra_body": THINK,
    }
    resp = await client.chat.completions.create(**kwargs)
    message = resp.choices[0].message
    reasoning = reasoning_of(message)
    assert reasoning
    assert reasoning.strip()
    assert_untagged(reasoning, message.content)
    assert not message.content
    assert resp.choices[0].finish_reason == "length"
    parts = await stream_parts(await client.chat.completions.create(**kwargs, stream=True))
    assert joined(parts[0], "reasoning") == reasoning
    assert joined(parts[0], "content") == ""


async def test_each_of_n_choices_reasons_on_its_own(client: openai.AsyncOpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 40,
        "n": 2,
        "extra_body": THINK,
    }
    resp = await client.chat.completions.create(**kwargs)
    assert [c.index for c in resp.choices] == [0, 1]
    parts = await stream_parts(await client.chat.completions.create(**kwargs, stream=True))
    assert sorted(parts) == [0, 1]
    for choice in resp.choices:
        reasoning = reasoning_of(choice.message)
        assert reasoning
        assert reasoning.strip()
        assert_untagged(reasoning, choice.message.content)
        seq = parts[choice.index]
        assert seq[0][0] == "reasoning"
        assert joined(seq, "reasoning") == reasoning
        assert joined(seq, "content") == (choice.message.content or "")


async def test_reasoning_comes_before_a_tool_call(client: openai.AsyncOpenAI) -> None:
    tool: Any = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"topic": {"type": "string"}},
                "required": ["topic"],
            },
        },
    }
    resp = await client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[tool],
        tool_choice="required",
        max_tokens=300,
        extra_body=THINK,
    )
    choice = resp.choices[0]
    reasoning = reasoning_of(choice.message)
    assert reasoning
    assert reasoning.strip()
    assert_untagged(reasoning, choice.message.content)
    assert "<tool_call>" not in reasoning
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    assert calls[0].type == "function"
