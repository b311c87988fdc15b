"""Agent controls on the transformers engine (tiny random Qwen3 on the CPU, the card's hermes and
qwen3 parsers), through the official ``openai`` and ``anthropic`` clients: the same checks as
against the mocker (``tests/e2e/agent_checks.py``). Random weights write whatever the grammar
allows, so a valid call here is the grammar's doing (decision 028)."""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import pytest_asyncio

from services.cli.stack import Stack
from tests.e2e import agent_checks as checks
from tests.e2e.conftest import running_stack
from tests.engines.conftest import MODEL, SEED

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("xgrammar")

pytestmark = pytest.mark.asyncio(loop_scope="module")

STREAM = pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])


@pytest.fixture(scope="module")
def agent_stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    """``jetserve up --engine hf`` with one worker whose card names hermes tool calls and qwen3
    reasoning (the tiny model's family)."""
    worker_args = [
        *("--random-weights", "--device", "cpu", "--seed", str(SEED)),
        *("--block-size", "16", "--num-blocks", "256", "--max-num-seqs", "4"),
        *("--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"),
    ]
    with running_stack(
        tmp_path_factory.mktemp("hf-agent"),
        tiny_model_dir,
        ready_timeout_s=120,
        workers=1,
        engine="hf",
        model_name=MODEL,
        mocker_args=shlex.join(worker_args),
    ) as stack:
        yield stack


@pytest_asyncio.fixture(loop_scope="module")
async def client(agent_stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(
        base_url=f"{agent_stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300
    )
    try:
        yield c
    finally:
        await c.close()


@pytest_asyncio.fixture(loop_scope="module")
async def claude(agent_stack: Stack) -> AsyncIterator[anthropic.AsyncAnthropic]:
    c = anthropic.AsyncAnthropic(
        base_url=agent_stack.base_url, api_key="unused", max_retries=0, timeout=300
    )
    try:
        yield c
    finally:
        await c.close()


@STREAM
@pytest.mark.parametrize("choice", ["required", checks.NAMED], ids=["required", "named"])
async def test_hf_forced_choice_without_parallel_calls_gives_one_valid_call(
    client: openai.AsyncOpenAI, choice: Any, stream: bool
) -> None:
    calls = await checks.forced_chat_call(client, MODEL, choice, stream=stream)
    assert len(calls) == 1
    if choice == checks.NAMED:
        assert calls[0][0] == "get_time"


async def test_hf_responses_without_parallel_calls_gives_one_call(
    client: openai.AsyncOpenAI,
) -> None:
    assert len(await checks.forced_responses_call(client, MODEL)) == 1


@STREAM
@pytest.mark.parametrize(
    "choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"]
)
async def test_hf_anthropic_forced_choice_gives_one_tool_use(
    claude: anthropic.AsyncAnthropic, choice: dict[str, Any], stream: bool
) -> None:
    uses = await checks.forced_anthropic_call(claude, MODEL, choice, stream=stream)
    assert len(uses) == 1
    if choice["type"] == "tool":
        assert uses[0][0] == "get_weather"


async def test_hf_a_zero_thinking_budget_leaves_no_reasoning(client: openai.AsyncOpenAI) -> None:
    """With thinking asked for, the block is forced open; a budget of 0 closes it at once, and
    the named call follows."""
    reasoning, message = await checks.budgeted_reasoning(client, MODEL, 0, tools=True)
    assert reasoning.strip() == ""
    assert [c.function.name for c in message.tool_calls or []] == ["get_time"]
