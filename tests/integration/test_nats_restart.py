"""A nats-server killed (SIGKILL) under streaming load and started again on its port and store.

Every service runs as its own process (``services.cli.stack.Stack``, as ``jetserve up`` runs
them); the stack's private nats-server is killed by its pid and started again with the same
command, as the launcher's supervisor does. Every request in flight completes or ends with a
typed error (none hangs), the stack serves again (the time it took is printed, not judged: a
busy machine may be slow), and the registry and the router's KV index come back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.cli.stack import Stack, wait_for_port
from shared import codec
from shared.bus import connect
from shared.messages import RouteDecision
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.subjects import Subjects
from tests.e2e.conftest import running_stack
from tests.support import eventually_async, eventually_awaited, registered_cards

MODEL = DEFAULT_MODEL_NAME
DEADLINE_S = 20.0
"""The HTTP client's timeout: a request silent this long raises (a hang fails the test)."""
SERVING_AGAIN_HANG_S = 60.0
"""Probe for a served request this long after nats-server is back (normally ~1-2 s)."""
SUPERVISOR_DELAY_S = 0.5
"""The launcher's first restart backoff."""
WAIT_S = 10.0
LOAD_CLIENTS = 3

pytestmark = pytest.mark.timeout(150)


@dataclass
class Outcome:
    """How one request ended."""

    started: float
    ended: float
    status: int
    code: str | None = None
    """The typed error's code (HTTP error body or SSE error event); ``None`` = no error."""
    is_complete: bool = False
    request_id: str = ""

    @property
    def is_typed_error(self) -> bool:
        return self.code is not None


@pytest.fixture
def stack(tmp_path: Path, model_dir: Path) -> Iterator[Stack]:
    """A private stack (nats-server included) with two realistic-speed workers, kv routing."""
    with running_stack(
        tmp_path,
        model_dir,
        router_mode="kv",
        mocker_args="--speedup-ratio 1 --seed 1",
        log_level="INFO",
    ) as s:
        try:
            yield s
        finally:
            print(_logs(s))  # shown only when the test failed


def _logs(stack: Stack) -> str:
    return "\n".join(f"--- {c.name}\n{c.tail(25)}" for c in stack.children)


@pytest.fixture
async def observer(stack: Stack) -> AsyncIterator[Client]:
    """A client that reconnects like the services (it watches decisions across the restart)."""
    nc = await connect(stack.nats_url, name="test-observer")
    try:
        yield nc
    finally:
        await nc.close()


class Decisions:
    """Every ``RouteDecision`` seen, by bus request id."""

    def __init__(self) -> None:
        self.seen: dict[str, RouteDecision] = {}

    async def on_msg(self, msg: Msg) -> None:
        decision = codec.decode(msg.data, RouteDecision)
        self.seen[decision.request_id] = decision

    async def of(self, request_id: str) -> RouteDecision:
        """The last decision for a request (a resubmission has a suffixed id)."""
        found = await eventually_async(
            lambda: [d for r, d in self.seen.items() if r.startswith(request_id)],
            timeout_s=WAIT_S,
            message=f"no routing decision for {request_id}",
        )
        return max(found, key=lambda d: d.ts)


def _cached_blocks(decision: RouteDecision) -> int:
    """Blocks of the prompt the chosen worker has cached (in-flight overlap left out)."""
    chosen = next(c for c in decision.candidates if c.worker_id == decision.worker_id)
    return chosen.overlap_blocks - chosen.inflight_blocks


def _prompt(tag: str, words: int = 120) -> str:
    return " ".join(f"{tag}{i}" for i in range(words))


async def _chat(http: httpx.AsyncClient, content: str, *, max_tokens: int, stream: bool) -> Outcome:
    """Send one chat completion and classify how it ended (complete, or which typed error)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    started = time.monotonic()
    async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        raw = await resp.aread()
    outcome = Outcome(started, time.monotonic(), resp.status_code)
    outcome.request_id = resp.headers.get("x-request-id", "")
    if resp.status_code != 200:
        outcome.code = json.loads(raw)["error"]["code"]
    elif not stream:
        outcome.is_complete = json.loads(raw)["choices"][0]["finish_reason"] is not None
    else:
        for line in raw.decode().splitlines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                outcome.code = event["error"]["code"]
            elif any(c.get("finish_reason") for c in event.get("choices", ())):
                outcome.is_complete = True
    return outcome


async def _wait_for_workers(nc: Client, subjects: Subjects, count: int) -> None:
    async def registered() -> bool:
        return len(await registered_cards(nc.jetstream(), subjects.namespace)) >= count

    await eventually_awaited(
        registered,
        timeout_s=WAIT_S * 3,
        interval_s=0.1,
        message=f"fewer than {count} workers registered",
    )


async def _routed_with_cache(
    http: httpx.AsyncClient, decisions: Decisions, prompt: str
) -> list[RouteDecision]:
    """Send ``prompt`` until its routing decision shows cached blocks (bounded); returns the
    decisions, that one last."""
    tries: list[RouteDecision] = []
    for _ in range(25):
        outcome = await _chat(http, prompt, max_tokens=4, stream=False)
        assert outcome.is_complete, outcome
        tries.append(await decisions.of(outcome.request_id))
        if _cached_blocks(tries[-1]) > 0:
            return tries
        await asyncio.sleep(0.2)
    raise AssertionError(f"no KV overlap for a repeated prompt: {tries}")


async def _load(http: httpx.AsyncClient, client: int, stop: asyncio.Event) -> list[Outcome]:
    """Streamed requests one after another until ``stop``."""
    outcomes: list[Outcome] = []
    while not stop.is_set() and len(outcomes) < 50:
        prompt = _prompt(f"load{client}x{len(outcomes)}x", 40)
        outcomes.append(await _chat(http, prompt, max_tokens=200, stream=True))
    return outcomes


async def _first_success_after(http: httpx.AsyncClient, back: float) -> float:
    """Seconds from ``back`` until a request completes (probing every 0.1 s, bounded)."""
    i = 0
    while time.monotonic() - back < SERVING_AGAIN_HANG_S:
        outcome = await _chat(http, f"are you back? {i}", max_tokens=4, stream=False)
        if outcome.is_complete:
            return time.monotonic() - back
        assert outcome.is_typed_error, outcome
        i += 1
        await asyncio.sleep(0.1)
    raise AssertionError(f"the stack did not serve again within {SERVING_AGAIN_HANG_S:g} s")


async def test_stack_survives_a_killed_and_restarted_nats_server(
    stack: Stack, observer: Client
) -> None:
    subjects = Subjects(stack.config.namespace)
    decisions = Decisions()
    await observer.subscribe(subjects.decisions, cb=decisions.on_msg)
    await _wait_for_workers(observer, subjects, 2)
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=DEADLINE_S) as http:
        before = (await _routed_with_cache(http, decisions, _prompt("a")))[-1]

        stop = asyncio.Event()
        load = [asyncio.create_task(_load(http, i, stop)) for i in range(LOAD_CLIENTS)]
        await asyncio.sleep(1.5)  # streams are in flight
        nats = next(c for c in stack.children if c.name == "nats")
        killed_at = time.monotonic()
        os.kill(nats.proc.pid, signal.SIGKILL)
        nats.proc.wait(timeout=5)
        await asyncio.sleep(SUPERVISOR_DELAY_S)
        stack.restart(nats)
        wait_for_port(int(stack.nats_url.rsplit(":", 1)[1]), timeout_s=10)
        back_at = time.monotonic()

        recovery_s = await _first_success_after(http, back_at)
        print(f"serving again {recovery_s:.2f} s after nats-server was back")
        await asyncio.sleep(1.5)
        stop.set()
        done = await asyncio.wait_for(asyncio.gather(*load), DEADLINE_S * 3)
        outcomes = [o for client in done for o in client]

        models = (await http.get("/v1/models")).json()
        after_tries = await _routed_with_cache(http, decisions, _prompt("a"))
        after = after_tries[-1]
        fresh = await _chat(http, _prompt("b"), max_tokens=4, stream=False)
        fresh_worker = (await decisions.of(fresh.request_id)).worker_id
        await asyncio.sleep(0.5)  # its KV events reach the router
        learned = (await _routed_with_cache(http, decisions, _prompt("b")))[-1]

    in_flight = [o for o in outcomes if o.started < killed_at < o.ended]
    assert in_flight, "no request was in flight when nats-server was killed"
    # Each ended, complete or with a typed error: one that hung would have raised ReadTimeout.
    assert all(o.is_complete or o.is_typed_error for o in outcomes), outcomes
    assert [m["id"] for m in models["data"]] == [MODEL]
    # The index kept what it knew, and learns from the events stored after the restart.
    assert after.worker_id == before.worker_id, (
        f"the router lost a worker's blocks: before {before.candidates}, "
        f"after {after_tries[0].candidates}"
    )
    assert learned.worker_id == fresh_worker, "the router missed events stored after the restart"
