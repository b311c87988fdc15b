"""Request migration end to end (decision 017): SIGKILL the worker serving a request mid-stream;
the client's text equals, token for token, the same request's text without a kill, and usage
counts each token once. The kill is seen on the bus as one ``Migrated`` message."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import openai
import pytest

from services.cli.stack import Stack
from shared import codec
from shared.messages import Migrated, RouteDecision
from shared.subjects import Subjects
from tests.e2e.conftest import MODEL, running_stack
from tests.support import eventually_async

CHAT = [{"role": "user", "content": "Tell me about the river town."}]
MAX_TOKENS = 120


@pytest.fixture
def slow_stack(tmp_path: Path, model_dir: Path) -> Iterator[Stack]:
    """Two realistic-speed workers, in two processes (one is killed)."""
    with running_stack(
        tmp_path, model_dir, workers=2, mocker_args="--speedup-ratio 1 --seed 1"
    ) as s:
        yield s


class Bus:
    """What the test watches on the stack's NATS: routing decisions and migrations."""

    def __init__(self) -> None:
        self.decisions: dict[str, str] = {}
        self.migrations: list[Migrated] = []

    async def on_decision(self, msg: Any) -> None:
        decision = codec.decode(msg.data, RouteDecision)
        self.decisions.setdefault(decision.request_id, decision.worker_id)

    async def on_migration(self, msg: Any) -> None:
        self.migrations.append(codec.decode(msg.data, Migrated))


@pytest.fixture
async def bus(slow_stack: Stack) -> AsyncIterator[Bus]:
    nc = await nats.connect(slow_stack.nats_url)
    subjects = Subjects(slow_stack.config.namespace)
    watched = Bus()
    await nc.subscribe(subjects.decisions, cb=watched.on_decision)
    await nc.subscribe(subjects.migrations, cb=watched.on_migration)
    await nc.flush()
    try:
        yield watched
    finally:
        await nc.close()


def _worker_pids(stack: Stack) -> dict[str, int]:
    """Worker id -> pid of the mocker process hosting it (from its ``worker_started`` line)."""
    found: dict[str, int] = {}
    for child in stack.children:
        if not child.name.startswith("mocker") or child.log_path is None:
            continue
        for line in child.log_path.read_text().splitlines():
            if '"worker_started"' in line:
                found[json.loads(line)["worker_id"]] = child.proc.pid
    return found


def _client(stack: Stack, request_id: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1",
        api_key="x",
        max_retries=0,
        default_headers={"X-Request-Id": request_id},
    )


async def _stream(
    stack: Stack, request_id: str, *, after_chunks: int = 0, kill: Bus | None = None
) -> tuple[str, Any]:
    """Stream one seeded request; with ``kill``, SIGKILL its worker after ``after_chunks``."""
    async with _client(stack, request_id) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=CHAT,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage, chunks = [], None, 0
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            text.extend(choice.delta.content or "" for choice in chunk.choices)
            chunks += 1
            if kill is not None and chunks == after_chunks:
                worker_id = kill.decisions[request_id]
                os.kill(_worker_pids(stack)[worker_id], signal.SIGKILL)
        return "".join(text), usage


async def test_a_stream_whose_worker_is_killed_goes_on_with_the_same_text(
    slow_stack: Stack, bus: Bus
) -> None:
    await _stream(slow_stack, "warm-up")  # tokenizers load on first use: keep it out of the timing
    started = time.monotonic()
    reference, reference_usage = await _stream(slow_stack, "reference-1")
    reference_s = time.monotonic() - started
    started = time.monotonic()
    text, usage = await _stream(slow_stack, "migrated-1", after_chunks=20, kill=bus)
    migrated_s = time.monotonic() - started

    assert text == reference
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        reference_usage.prompt_tokens,
        reference_usage.completion_tokens,
    )
    assert reference_usage.completion_tokens == MAX_TOKENS
    [migrated] = await eventually_async(
        lambda: bus.migrations, timeout_s=5, interval_s=0.1, message="no Migrated on the bus"
    )
    assert (migrated.request_id, migrated.kind, migrated.attempt) == ("migrated-1", "ongoing", 1)
    assert 0 < migrated.generated_tokens < MAX_TOKENS
    assert migrated.from_worker == bus.decisions["migrated-1"]
    print(f"stream: {reference_s:.2f}s without a kill, {migrated_s:.2f}s with a migration")


async def test_a_non_streamed_request_whose_worker_is_killed_completes_the_same(
    slow_stack: Stack, bus: Bus
) -> None:
    async def complete(request_id: str, kill: bool) -> Any:
        async with _client(slow_stack, request_id) as client:
            call = asyncio.ensure_future(
                client.chat.completions.create(
                    model=MODEL,
                    messages=CHAT,
                    max_tokens=MAX_TOKENS,
                    seed=7,  # type: ignore[arg-type]
                )
            )
            if kill:
                await eventually_async(
                    lambda: request_id in bus.decisions,
                    message=f"no routing decision for {request_id}",
                )
                await asyncio.sleep(0.5)  # into the generation (either kind of migration will do)
                os.kill(_worker_pids(slow_stack)[bus.decisions[request_id]], signal.SIGKILL)
            return await call

    reference = await complete("reference-2", kill=False)
    migrated = await complete("migrated-2", kill=True)
    assert migrated.choices[0].message.content == reference.choices[0].message.content
    assert migrated.usage.completion_tokens == reference.usage.completion_tokens == MAX_TOKENS
    assert [m.request_id for m in bus.migrations] == ["migrated-2"]
