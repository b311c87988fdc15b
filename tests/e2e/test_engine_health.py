"""An engine that hangs in a live process is found (decision 029), end to end: a stack with one
healthy mocker, plus a second mocker process told to hang (``--hang-after-tokens``). Its streams
migrate to the healthy worker and complete with the same text; new requests avoid it; with no
traffic at all its idle canary finds the hang. Waits are bounded, never timed: the formatter's
own idle timeout (60 s) is far above every bound here, so a request that completes in time was
migrated, which the ``Migrated`` messages confirm."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import openai
import pytest

from services.cli.stack import Stack, free_port
from shared import codec
from shared.messages import Migrated, RouteDecision
from shared.subjects import Subjects
from tests.e2e.conftest import MODEL, running_stack
from tests.support import eventually, eventually_async, eventually_awaited, registered_cards

MAX_TOKENS = 120
BOUND_S = 30.0
"""Generous bound for what should take seconds (the formatter gives up only after 60 s)."""
HUNG = "hung-0"


@pytest.fixture
def stack(tmp_path: Path, model_dir: Path) -> Iterator[Stack]:
    """One healthy realistic-speed worker; the test adds the one that hangs."""
    with running_stack(
        tmp_path, model_dir, workers=1, mocker_args="--speedup-ratio 1 --seed 1"
    ) as s:
        yield s


class HungMocker:
    """``python -m services.mocker`` with the test-only hang, joined to the stack's bus."""

    def __init__(self, stack: Stack, log_path: Path, *args: str) -> None:
        self.metrics_port = free_port()
        self.log_path = log_path
        env = {
            **os.environ,
            "JETSERVE_NATS_URL": stack.nats_url,
            "JETSERVE_NAMESPACE": stack.config.namespace,
            "JETSERVE_LOG_LEVEL": "DEBUG",
            "JETSERVE_LOG_FORMAT": "json",
        }
        command = [
            sys.executable,
            "-m",
            "services.mocker",
            "--worker-id",
            HUNG,
            "--model-path",
            str(stack.config.model_path),
            "--model-name",
            MODEL,
            "--speedup-ratio",
            "1",
            "--seed",
            "1",
            "--metrics-port",
            str(self.metrics_port),
            *args,
        ]
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def events(self, event: str) -> list[dict[str, Any]]:
        lines = self.log_path.read_text().splitlines()
        return [e for line in lines if (e := _json(line)) and e.get("event") == event]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


def _json(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@pytest.fixture
def hung_mocker(stack: Stack, tmp_path: Path) -> Iterator[Callable[..., HungMocker]]:
    started: list[HungMocker] = []

    def start(*args: str) -> HungMocker:
        mocker = HungMocker(stack, tmp_path / f"{HUNG}-{len(started)}.log", *args)
        started.append(mocker)
        return mocker

    yield start
    for mocker in started:
        mocker.stop()


class Bus:
    """Routing decisions and migrations, as seen on the stack's NATS."""

    def __init__(self, nc: Any, subjects: Subjects) -> None:
        self.nc = nc
        self.subjects = subjects
        self.decisions: dict[str, str] = {}
        self.migrations: list[Migrated] = []

    async def on_decision(self, msg: Any) -> None:
        decision = codec.decode(msg.data, RouteDecision)
        self.decisions.setdefault(decision.request_id, decision.worker_id)

    async def on_migration(self, msg: Any) -> None:
        self.migrations.append(codec.decode(msg.data, Migrated))

    async def workers(self) -> set[str]:
        cards = await registered_cards(self.nc.jetstream(), self.subjects.namespace)
        return {card.worker_id for card in cards}


@pytest.fixture
async def bus(stack: Stack) -> AsyncIterator[Bus]:
    nc = await nats.connect(stack.nats_url)
    subjects = Subjects(stack.config.namespace)
    watched = Bus(nc, subjects)
    await nc.subscribe(subjects.decisions, cb=watched.on_decision)
    await nc.subscribe(subjects.migrations, cb=watched.on_migration)
    await nc.flush()
    try:
        yield watched
    finally:
        await nc.close()


async def _stream(
    stack: Stack, request_id: str, topic: str, took: dict[str, float] | None = None
) -> tuple[str, int]:
    """One seeded streamed chat completion: its text and completion tokens (and, in ``took``,
    how long it took)."""
    started = time.monotonic()
    async with openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1",
        api_key="x",
        max_retries=0,
        default_headers={"X-Request-Id": request_id},
    ) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Tell me about {topic}."}],
            max_tokens=MAX_TOKENS,
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, tokens = [], 0
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            text.extend(choice.delta.content or "" for choice in chunk.choices)
        if took is not None:
            took[request_id] = time.monotonic() - started
        return "".join(text), tokens


async def _healthy_worker(bus: Bus) -> str:
    async def two() -> set[str] | None:
        workers = await bus.workers()
        return workers if len(workers) == 2 else None

    workers = await eventually_awaited(two, timeout_s=BOUND_S, message="the hung worker's card")
    return next(w for w in workers if w != HUNG)


async def _metric(port: int, name: str) -> float | None:
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{worker_id="{HUNG}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


TOPICS = ("the river town", "the mountain pass", "the old harbour", "the salt marsh")


async def test_streams_on_an_engine_that_hangs_migrate_and_complete(
    stack: Stack, bus: Bus, hung_mocker: Callable[..., HungMocker]
) -> None:
    hung = hung_mocker("--hang-after-tokens", "30", "--engine-stall-s", "2")
    healthy = await _healthy_worker(bus)
    ids = [f"hang-{i}" for i in range(len(TOPICS))]
    took: dict[str, float] = {}
    # round-robin over two workers: half of these land on the one that hangs
    results = await asyncio.wait_for(
        asyncio.gather(
            *(_stream(stack, rid, topic, took) for rid, topic in zip(ids, TOPICS, strict=False))
        ),
        timeout=BOUND_S,
    )
    on_hung = [rid for rid in ids if bus.decisions.get(rid) == HUNG]
    assert on_hung, f"no request went to the hung worker: {bus.decisions}"
    assert all(tokens == MAX_TOKENS for _, tokens in results), results
    # each left the hung worker once (one may have been routed back to it before its loss was
    # known, refused there with a retryable error and moved again: a second Migrated)
    await eventually_async(
        lambda: {m.request_id for m in bus.migrations if m.from_worker == HUNG} == set(on_hung),
        timeout_s=BOUND_S,
        message=lambda: f"not every request of the hung worker migrated: {bus.migrations}",
    )
    assert {m.request_id for m in bus.migrations} == set(on_hung)
    [unhealthy] = hung.events("engine_unhealthy")
    assert unhealthy["reason"] == "engine_stalled"
    assert hung.proc.poll() is None  # the process lives on; only its engine hung

    # new requests avoid it; the same requests give the same text there (017's exactness)
    await eventually_awaited(
        lambda: _gone(bus), timeout_s=BOUND_S, message="the hung worker stays registered"
    )
    refs = [f"ref-{i}" for i in range(len(TOPICS))]
    references = await asyncio.wait_for(
        asyncio.gather(
            *(_stream(stack, rid, topic) for rid, topic in zip(refs, TOPICS, strict=False))
        ),
        timeout=BOUND_S,
    )
    assert {bus.decisions[rid] for rid in refs} == {healthy}
    assert results == references
    assert await _metric(hung.metrics_port, "jetserve_mocker_engine_healthy") == 0
    print("stream seconds:", {rid: round(s, 2) for rid, s in sorted(took.items())}, on_hung)


async def _gone(bus: Bus) -> bool:
    return HUNG not in await bus.workers()


async def test_an_idle_engine_that_hangs_is_found_by_its_canary(
    stack: Stack, bus: Bus, hung_mocker: Callable[..., HungMocker]
) -> None:
    hung = hung_mocker(
        "--hang-after-tokens", "0", "--health-check-idle-s", "0.5", "--health-check-timeout-s", "1"
    )
    healthy = await _healthy_worker(bus)  # registered: then its first canary hangs
    await eventually_awaited(
        lambda: _gone(bus), timeout_s=BOUND_S, message="the hung worker stays registered"
    )
    [unhealthy] = eventually(
        lambda: hung.events("engine_unhealthy"), timeout_s=BOUND_S, message="no log line"
    )
    assert (unhealthy["reason"], unhealthy["worker_id"]) == ("canary_timeout", HUNG)
    assert hung.proc.poll() is None
    ids = [f"after-{i}" for i in range(2)]
    results = await asyncio.wait_for(
        asyncio.gather(
            *(_stream(stack, rid, topic) for rid, topic in zip(ids, TOPICS, strict=False))
        ),
        timeout=BOUND_S,
    )
    assert all(tokens == MAX_TOKENS for _, tokens in results)
    assert {bus.decisions[rid] for rid in ids} == {healthy}
    assert not bus.migrations  # nothing was in flight on it


async def test_an_engine_that_resumes_serves_again(
    stack: Stack, bus: Bus, hung_mocker: Callable[..., HungMocker]
) -> None:
    hung = hung_mocker(
        "--hang-after-tokens",
        "0",
        "--hang-for-s",
        "3",
        "--health-check-idle-s",
        "0.5",
        "--health-check-timeout-s",
        "1",
    )
    await _healthy_worker(bus)
    eventually(lambda: hung.events("engine_unhealthy"), timeout_s=BOUND_S, message="never found")
    eventually(lambda: hung.events("engine_recovered"), timeout_s=BOUND_S, message="never back")
    await _healthy_worker(bus)  # its card is back
    ids = [f"back-{i}" for i in range(4)]
    await asyncio.wait_for(
        asyncio.gather(
            *(_stream(stack, rid, topic) for rid, topic in zip(ids, TOPICS, strict=False))
        ),
        timeout=BOUND_S,
    )
    assert HUNG in {bus.decisions[rid] for rid in ids}
    assert await _metric(hung.metrics_port, "jetserve_mocker_engine_healthy") == 1
