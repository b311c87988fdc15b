"""Migration with a real engine (decision 017): two transformers workers (the same seeded random
tiny Qwen3 on the CPU), the one serving a greedy stream SIGKILLed mid-stream; the request goes on
on the other worker, its earlier output resumed as prompt, and the client's text equals the same
request's text without a kill, token for token (a real forward pass over the resumed prompt
gives what the killed worker would have)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import openai
import pytest

from services.cli.stack import Stack
from shared import codec
from shared.messages import Migrated, RouteDecision
from shared.subjects import Subjects
from tests.engines.conftest import MODEL, hf_stack
from tests.support import eventually_async

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT_IDS = [9707, 11, 1879, 0, 358, 1079, 264, 1273, 9934, 13]
MAX_TOKENS = 60


@pytest.fixture
def two_workers(tmp_path: Path, tiny_model_dir: Path) -> Iterator[Stack]:
    with hf_stack(tmp_path / "stack", tiny_model_dir, workers=2, max_num_seqs=4) as stack:
        yield stack


def _worker_pid(stack: Stack, worker_id: str) -> int:
    """The pid of the ``hf_worker`` process that logged ``worker_started`` for ``worker_id``."""
    for child in stack.children:
        if not child.name.startswith("hf_worker") or child.log_path is None:
            continue
        for line in child.log_path.read_text().splitlines():
            if '"worker_started"' in line and json.loads(line)["worker_id"] == worker_id:
                return child.proc.pid
    raise AssertionError(f"no process logged worker_started for {worker_id}")


async def _stream(
    stack: Stack, request_id: str, kill_after: int = 0
) -> tuple[str, Any, list[Migrated]]:
    """One greedy stream; with ``kill_after``, SIGKILL its worker after that many chunks."""
    nc = await nats.connect(stack.nats_url)
    decisions: dict[str, str] = {}
    migrations: list[Migrated] = []

    async def on_decision(msg: Any) -> None:
        decision = codec.decode(msg.data, RouteDecision)
        decisions.setdefault(decision.request_id, decision.worker_id)

    async def on_migration(msg: Any) -> None:
        migrations.append(codec.decode(msg.data, Migrated))

    subjects = Subjects(stack.config.namespace)
    await nc.subscribe(subjects.decisions, cb=on_decision)
    await nc.subscribe(subjects.migrations, cb=on_migration)
    await nc.flush()
    client = openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1",
        api_key="x",
        max_retries=0,
        default_headers={"X-Request-Id": request_id},
    )
    try:
        stream = await client.completions.create(
            model=MODEL,
            prompt=PROMPT_IDS,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text: list[str] = []
        usage, chunks = None, 0
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            text.extend(choice.text for choice in chunk.choices)
            chunks += 1
            if kill_after and chunks == kill_after:
                os.kill(_worker_pid(stack, decisions[request_id]), signal.SIGKILL)
        if kill_after:
            await eventually_async(
                lambda: migrations,
                timeout_s=5,
                interval_s=0.1,
                message="no Migrated on the bus after the worker was killed",
            )
        return "".join(text), usage, migrations
    finally:
        await client.close()
        await nc.close()


async def test_a_greedy_stream_whose_worker_is_killed_goes_on_with_the_same_text(
    two_workers: Stack,
) -> None:
    reference, reference_usage, _ = await _stream(two_workers, "reference")
    text, usage, migrations = await _stream(two_workers, "migrated", kill_after=10)
    assert reference_usage.completion_tokens == MAX_TOKENS
    assert usage.completion_tokens == MAX_TOKENS
    assert text == reference
    [migrated] = migrations
    assert (migrated.request_id, migrated.attempt) == ("migrated", 1)
    assert 0 < migrated.generated_tokens < MAX_TOKENS
