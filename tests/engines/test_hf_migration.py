"""Migration with a real engine (decision 017): two transformers workers (the same seeded random
tiny Qwen3 on the CPU), the one serving a greedy stream SIGKILLed mid-stream; the request goes on
on the other worker, its earlier output resumed as prompt, and the client's text equals the same
request's text without a kill, token for token (a real forward pass over the resumed prompt
gives what the killed worker would have). The same when only the worker's engine process is
killed: the worker goes down with it (decision 033) and the request migrates the same way."""

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


def _pid(stack: Stack, worker_id: str, what: str) -> int:
    """The pid of the ``hf_worker`` process that logged ``worker_started`` for ``worker_id``
    (``what`` "worker"), or of the engine process it started (``what`` "engine")."""
    for child in stack.children:
        if not child.name.startswith("hf_worker") or child.log_path is None:
            continue
        lines = [json.loads(x) for x in child.log_path.read_text().splitlines() if x[:1] == "{"]
        if any(x["event"] == "worker_started" and x["worker_id"] == worker_id for x in lines):
            if what == "worker":
                return child.proc.pid
            [engine] = [x["pid"] for x in lines if x["event"] == "hf_engine_process_started"]
            return int(engine)
    raise AssertionError(f"no process logged worker_started for {worker_id}")


async def _stream(
    stack: Stack, request_id: str, kill_after: int = 0, kill: str = "worker"
) -> tuple[str, Any, list[Migrated]]:
    """One greedy stream; with ``kill_after``, SIGKILL its worker (or its engine process) after
    that many chunks."""
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
                os.kill(_pid(stack, decisions[request_id], kill), signal.SIGKILL)
        if kill_after:
            await eventually_async(
                lambda: migrations,
                timeout_s=15,
                interval_s=0.1,
                message="no Migrated on the bus after the worker was killed",
            )
        return "".join(text), usage, migrations
    finally:
        await client.close()
        await nc.close()


@pytest.mark.parametrize("kill", ["worker", "engine"])
async def test_a_greedy_stream_whose_worker_is_killed_goes_on_with_the_same_text(
    two_workers: Stack, kill: str
) -> None:
    reference, reference_usage, _ = await _stream(two_workers, "reference")
    text, usage, migrations = await _stream(two_workers, "migrated", kill_after=10, kill=kill)
    assert reference_usage.completion_tokens == MAX_TOKENS
    assert usage.completion_tokens == MAX_TOKENS
    assert text == reference
    [migrated] = migrations
    assert (migrated.request_id, migrated.attempt) == ("migrated", 1)
    assert 0 < migrated.generated_tokens < MAX_TOKENS
