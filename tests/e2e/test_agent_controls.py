"""Agent controls against the mocker, through the official ``openai`` and ``anthropic`` clients
(``tests/e2e/agent_checks.py``; the same checks run on the transformers engine in
``tests/engines/test_hf_agent_controls.py``): required and named tool choice give valid calls,
``parallel_tool_calls: false`` (Anthropic ``disable_parallel_tool_use``) gives one, in chat,
Responses and Messages, streamed and whole; a thinking budget bounds the reasoning."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from services.cli.stack import Stack
from tests.e2e import agent_checks as checks
from tests.e2e.conftest import MODEL

STREAM = pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])


@pytest.fixture
async def claude(stack: Stack) -> AsyncIterator[anthropic.AsyncAnthropic]:
    c = anthropic.AsyncAnthropic(base_url=stack.base_url, api_key="unused", max_retries=0)
    try:
        yield c
    finally:
        await c.close()


@STREAM
@pytest.mark.parametrize("choice", ["required", checks.NAMED], ids=["required", "named"])
async def test_a_forced_choice_without_parallel_calls_gives_one_valid_call(
    client: openai.AsyncOpenAI, choice: Any, stream: bool
) -> None:
    calls = await checks.forced_chat_call(client, MODEL, choice, stream=stream)
    assert len(calls) == 1
    if choice == checks.NAMED:
        assert calls[0][0] == "get_time"


async def test_responses_without_parallel_calls_gives_one_call(client: openai.AsyncOpenAI) -> None:
    names = await checks.forced_responses_call(client, MODEL)
    assert len(names) == 1


@STREAM
@pytest.mark.parametrize(
    "choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"]
)
async def test_anthropic_forced_choice_without_parallel_use_gives_one_tool_use(
    claude: anthropic.AsyncAnthropic, choice: dict[str, Any], stream: bool
) -> None:
    uses = await checks.forced_anthropic_call(claude, MODEL, choice, stream=stream)
    assert len(uses) == 1
    if choice["type"] == "tool":
        assert uses[0][0] == "get_weather"


async def test_a_zero_thinking_budget_leaves_no_reasoning(client: openai.AsyncOpenAI) -> None:
    reasoning, message = await checks.budgeted_reasoning(client, MODEL, 0, tools=True)
    assert reasoning == ""
    assert [c.function.name for c in message.tool_calls or []] == ["get_time"]


async def test_a_thinking_budget_bounds_the_reasoning_tokens(
    client: openai.AsyncOpenAI, model_dir: Path
) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    unbounded, _ = await checks.budgeted_reasoning(client, MODEL, 10_000, tools=False)
    budget = len(tokenizer.encode(unbounded, add_special_tokens=False).ids) // 2
    assert budget > 0, "the mocker wrote no reasoning to bound"
    bounded, _ = await checks.budgeted_reasoning(client, MODEL, budget, tools=False)
    assert 0 < len(tokenizer.encode(bounded, add_special_tokens=False).ids) <= budget


async def test_an_anthropic_thinking_budget_bounds_the_thinking_block(
    claude: anthropic.AsyncAnthropic, model_dir: Path
) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    message = await claude.messages.create(
        model=MODEL,
        max_tokens=1100,
        messages=checks.ASK,
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=checks.ANTHROPIC_TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    thinking = [b for b in message.content if b.type == "thinking"]
    assert thinking, message.content
    assert len(tokenizer.encode(thinking[0].thinking, add_special_tokens=False).ids) <= 1024  # type: ignore[union-attr]
    assert [b.type for b in message.content].count("tool_use") == 1
