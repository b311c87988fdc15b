"""Issue 26 through the real stack: ``POST``/``GET /busy_threshold`` reach every router replica
(a restarted one too) and change what they do; a bad admission header is a 400 for the
OpenAI client."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from services.cli.stack import Child, Stack
from tests.e2e.conftest import MODEL, running_stack
from tests.support import eventually

APPLIED = "busy_thresholds_applied"
"""The router's log event for thresholds it applied (``Router.on_busy_threshold``)."""
NONE = {
    "active_decode_blocks_threshold": None,
    "active_prefill_tokens_threshold": None,
    "active_prefill_tokens_threshold_frac": None,
}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


async def test_a_bad_priority_header_is_a_bad_request(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_headers={"x-dynamo-request-priority": "urgent"},
        )
    body: Any = caught.value.body
    assert body["param"] == "x-dynamo-request-priority"


async def test_good_admission_inputs_are_served(client: openai.AsyncOpenAI) -> None:
    done = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        extra_headers={
            "x-dynamo-request-priority": "2.5",
            "x-dynamo-request-strict-priority": "3",
            "x-dynamo-session-id": "e2e-session",
        },
        extra_body={"nvext": {"agent_hints": {"osl": 2, "priority": 2.5}}},
    )
    assert done.choices[0].finish_reason == "length"


@pytest.fixture(scope="module")
def two_routers(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """Two router replicas, one realistic-speed worker (a long request keeps it busy)."""
    # With the router queue a busy fleet would queue: answer at once instead.
    no_queue = ["--queue-max-length", "0"]
    with running_stack(
        tmp_path_factory.mktemp("busy"),
        model_dir,
        routers=2,
        workers=1,
        mocker_args="--speedup-ratio 1 --seed 1",
        service_args={"router": no_queue},
    ) as stack:
        yield stack


def _routers(stack: Stack) -> list[Child]:
    return [c for c in stack.children if c.name.startswith("router")]


def _applied(child: Child) -> int:
    assert child.log_path is not None
    return child.log_path.read_text(errors="replace").count(APPLIED)


def _post(stack: Stack, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{stack.base_url}/busy_threshold", json=body, timeout=10)


def _listed(stack: Stack) -> list[dict[str, Any]]:
    response = httpx.get(f"{stack.base_url}/busy_threshold", timeout=10)
    assert response.status_code == 200, response.text
    listed: list[dict[str, Any]] = response.json()["thresholds"]
    return listed


def test_thresholds_reach_every_router_and_a_restarted_one(two_routers: Stack) -> None:
    stack = two_routers
    routers = _routers(stack)
    assert len(routers) == 2
    before = [_applied(r) for r in routers]
    body = {"model": MODEL, "active_prefill_tokens_threshold": 123456}
    response = _post(stack, body)
    assert response.status_code == 200, response.text
    assert response.json() == {**NONE, **body}
    assert _listed(stack) == [{**NONE, **body}]
    for router, seen in zip(routers, before, strict=True):
        eventually(lambda r=router, s=seen: _applied(r) > s, message=f"{router.name} applied")
    # A router restarted after the change reads it from the bucket.
    old = routers[0]
    old.proc.send_signal(signal.SIGTERM)
    old.proc.wait(timeout=30)
    seen = _applied(old)
    fresh = stack.restart(old)
    eventually(lambda: _applied(fresh) > seen, timeout_s=30, message="the restarted router")
    assert _listed(stack) == [{**NONE, **body}]
    cleared = _post(stack, {"model": MODEL, **NONE})
    assert cleared.json() == {**NONE, "model": MODEL}
    assert _listed(stack) == []


async def test_a_tiny_threshold_makes_the_busy_worker_refuse(two_routers: Stack) -> None:
    stack = two_routers
    base = stack.base_url
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        long = asyncio.create_task(_long_request(http))
        try:
            set_ = _post(stack, {"model": MODEL, "active_decode_blocks_threshold": 0.0})
            assert set_.status_code == 200, set_.text
            # Busy as soon as the worker reports the long request's blocks in use.
            status = await _until_refused(http, timeout_s=15)
            assert status in (503, 529)
            _post(stack, {"model": MODEL, **NONE})  # the routers' own settings: none
            served = await _eventually_served(http, timeout_s=15)
            assert served == 200
        finally:
            long.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await long


async def _long_request(http: httpx.AsyncClient) -> None:
    """A streamed request that keeps the worker's KV blocks in use for seconds."""
    body = {**CHAT, "max_tokens": 3000, "stream": True, "ignore_eos": True}
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        async for _ in response.aiter_bytes():
            pass


async def _until_refused(http: httpx.AsyncClient, timeout_s: float) -> int:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        response = await http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
        if response.status_code != 200 or asyncio.get_running_loop().time() > deadline:
            return response.status_code
        await asyncio.sleep(0.2)


async def _eventually_served(http: httpx.AsyncClient, timeout_s: float) -> int:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        response = await http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
        if response.status_code == 200 or asyncio.get_running_loop().time() > deadline:
            return response.status_code
        await asyncio.sleep(0.2)
