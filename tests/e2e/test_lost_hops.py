"""A formatter or a gateway that dies mid-stream (decisions 017, 018): its hop notices at the
next message (NATS bounces it), gives it a grace to come back (it may only be moving to another
NATS node), then stops the request; whoever is left tells the client with a typed error."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.cli.stack import Stack
from services.formatter.recovery import GATEWAY_GRACE_S
from tests.e2e.conftest import MODEL, running_stack
from tests.support import eventually_async

BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hello"}],
    "max_tokens": 3000,
    "stream": True,
    "ignore_eos": True,
}
HANG_S = 60.0
"""A wait only a hang runs into (what is waited for takes a few seconds)."""


@pytest.fixture
def hop_stack(tmp_path: Path, model_dir: Path) -> Iterator[Stack]:
    """One realistic-speed worker: a long stream is still running when a hop dies."""
    with running_stack(
        tmp_path, model_dir, workers=1, mocker_args="--speedup-ratio 1 --seed 1"
    ) as s:
        yield s


def _pid(stack: Stack, name: str) -> int:
    return stack.pids()[name]


def _logged(stack: Stack, log: str, request_id: str, event: str) -> bool:
    for line in (stack.run_dir / log).read_text().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if obj.get("request_id") == request_id and obj.get("event") == event:
            return True
    return False


async def _until_logged(stack: Stack, log: str, request_id: str, event: str) -> float:
    """When (``time.monotonic()``) ``log`` was first seen holding ``event`` for the request."""
    return await eventually_async(
        lambda: _logged(stack, log, request_id, event) and time.monotonic(),
        timeout_s=HANG_S,
        interval_s=0.05,
        message=f"{log} never logged {event} for {request_id}",
    )


async def test_a_dead_formatter_ends_the_stream_with_a_typed_error(hop_stack: Stack) -> None:
    async with (
        httpx.AsyncClient(base_url=hop_stack.base_url, timeout=HANG_S) as http,
        http.stream("POST", "/v1/chat/completions", json=BODY) as resp,
    ):
        request_id = resp.headers["x-request-id"]
        lines = resp.aiter_lines()
        seen = 0
        async for line in lines:
            seen += line.startswith("data: ")
            if seen == 5:
                break
        os.kill(_pid(hop_stack, "formatter"), signal.SIGKILL)
        rest = [line async for line in lines]
    errors = [json.loads(x[6:]) for x in rest if x.startswith("data: {") and '"error"' in x]
    # Ended by the worker's grace (1 s) or the gateway's stall probe (2 s, then 1 s unanswered):
    # `formatter_lost`, not the gateway's idle `timeout`, nor a stream that never ends.
    assert [e["error"]["code"] for e in errors] == ["formatter_lost"]
    assert _logged(hop_stack, "mocker-0.log", request_id, "formatter_unreachable")


async def test_a_dead_gateway_gets_its_requests_stopped_at_the_worker(hop_stack: Stack) -> None:
    """The formatter gives a gateway whose chunks bounce ``GATEWAY_GRACE_S`` to come back and
    ask for a replay (decision 018), then cancels the worker."""
    async with (
        httpx.AsyncClient(base_url=hop_stack.base_url, timeout=HANG_S) as http,
        http.stream("POST", "/v1/chat/completions", json=BODY) as resp,
    ):
        request_id = resp.headers["x-request-id"]
        seen = 0
        async for line in resp.aiter_lines():
            seen += line.startswith("data: ")
            if seen == 5:
                break
        killed_at = time.monotonic()  # taken first: nothing can bounce before it
        os.kill(_pid(hop_stack, "gateway"), signal.SIGKILL)
    gone_at = await _until_logged(hop_stack, "formatter.log", request_id, "gateway_gone")
    await _until_logged(hop_stack, "mocker-0.log", request_id, "request_cancelled")
    assert gone_at - killed_at >= GATEWAY_GRACE_S  # the gateway was given its grace first
