"""The whole stack (``services.cli.stack``: nats-server, preprocessor, router, formatter, gateway)
with one transformers worker (``python -m services.hf_worker``, tiny random Qwen3 on the CPU)
in place of the mockers, driven by the ``openai`` client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio

from services.cli.stack import Stack
from tests.engines.conftest import MODEL, SEED, hf_stack

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT_IDS = [9707, 11, 1879, 0, 358, 1079, 264, 1273, 9934, 13]


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    with hf_stack(
        tmp_path_factory.mktemp("hf-stack"), tiny_model_dir, workers=1, max_num_seqs=8
    ) as stack:
        yield stack


@pytest_asyncio.fixture(loop_scope="module")
async def client(one_worker: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=f"{one_worker.base_url}/v1", api_key="unused", max_retries=0)
    try:
        yield c
    finally:
        await c.close()


def reference_text(model_dir: Path, max_tokens: int) -> str:
    """What the same seeded weights generate greedily for ``PROMPT_IDS`` (plain ``generate``),
    decoded as the formatter does (special tokens skipped)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(SEED)
    config = AutoConfig.from_pretrained(str(model_dir))
    model_class: Any = AutoModelForCausalLM  # untyped boundary
    model = model_class.from_config(config, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([PROMPT_IDS]),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    ids = out[0, len(PROMPT_IDS) :].tolist()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return str(tokenizer.decode(ids, skip_special_tokens=True))


async def test_completion_is_the_models_greedy_output(
    client: openai.AsyncOpenAI, tiny_model_dir: Path
) -> None:
    result = await client.completions.create(
        model=MODEL,
        prompt=PROMPT_IDS,
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    choice = result.choices[0]
    assert choice.finish_reason == "length"
    assert result.usage is not None
    assert result.usage.prompt_tokens == len(PROMPT_IDS)
    assert result.usage.completion_tokens == 10
    assert choice.text
    assert choice.text == reference_text(tiny_model_dir, 10)


async def test_chat_completion(client: openai.AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=12,
        temperature=0.8,
        extra_body={"ignore_eos": True},
    )
    choice = result.choices[0]
    assert choice.finish_reason == "length"
    assert result.usage is not None
    assert result.usage.completion_tokens == 12
    assert result.usage.prompt_tokens > 5
    assert choice.message.content


async def test_streamed_chat_completion(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=16,
        temperature=0.7,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    deltas: list[str] = []
    finish = None
    usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                deltas.append(choice.delta.content)
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    assert finish == "length"
    assert usage is not None
    assert usage.completion_tokens == 16
    assert len(deltas) >= 2, "the answer came in one chunk: not streamed"
    assert "".join(deltas)
