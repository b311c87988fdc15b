"""Legacy completions with several prompts in one request (decision 030), through the official
``openai`` client: ``n`` choices per prompt numbered as OpenAI numbers them, usage summed,
streaming and not; the bad batches are 400s naming the prompt."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from services.cli.stack import Stack
from tests.e2e.conftest import MODEL

PROMPTS = ["The sea is", "A river runs", "Mountains are tall and"]


async def _alone(client: openai.AsyncOpenAI, prompt: Any) -> Any:
    return await client.completions.create(model=MODEL, prompt=prompt, max_tokens=8)


async def test_several_prompts_get_n_choices_each_in_openai_order(
    client: openai.AsyncOpenAI,
) -> None:
    batch = await client.completions.create(model=MODEL, prompt=PROMPTS, n=2, max_tokens=8)
    assert [c.index for c in batch.choices] == list(range(6))
    assert batch.usage is not None
    alone = [await _alone(client, p) for p in PROMPTS]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == 6 * 8
    assert batch.usage.total_tokens == batch.usage.prompt_tokens + 6 * 8


async def test_several_token_id_prompts_are_a_batch_too(client: openai.AsyncOpenAI) -> None:
    batch = await client.completions.create(
        model=MODEL, prompt=[[9707, 11], [785, 9396, 374], [40]], max_tokens=4
    )
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert batch.usage is not None
    assert batch.usage.prompt_tokens == 6


async def test_a_streamed_batch_renumbers_its_chunks_and_sums_usage_once(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.completions.create(
        model=MODEL,
        prompt=PROMPTS,
        n=2,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    ids = {chunk.id for chunk in chunks}
    assert len(ids) == 1
    usage = [chunk.usage for chunk in chunks if chunk.usage is not None]
    assert len(usage) == 1
    assert chunks[-1].usage is not None
    assert usage[0].completion_tokens == 6 * 8
    text: dict[int, str] = {}
    finished: dict[int, str | None] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            text[choice.index] = text.get(choice.index, "") + choice.text
            if choice.finish_reason is not None:
                finished[choice.index] = choice.finish_reason
    assert sorted(text) == list(range(6))
    assert finished == dict.fromkeys(range(6), "length")
    whole = await client.completions.create(model=MODEL, prompt=PROMPTS, n=2, max_tokens=8)
    assert whole.usage is not None
    assert usage[0].prompt_tokens == whole.usage.prompt_tokens


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        (["a", [1, 2]], "prompt"),
        (["a", ""], "prompt[1]"),
        ([[1, 2], []], "prompt[1]"),
        (["x"] * 129, "prompt"),
    ],
    ids=["mixed", "empty-string", "empty-ids", "too-many"],
)
async def test_bad_batches_are_400_naming_the_prompt(stack: Stack, prompt: Any, param: str) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        resp = await http.post(
            "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4}
        )
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == param


async def test_a_batch_for_an_unknown_model_is_one_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="no-such-model", prompt=PROMPTS, max_tokens=4)
