"""Failures end to end: a silent hop is a 504, a dead worker a 503, a disconnect a cancel."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from services.cli.stack import Stack
from tests.e2e.conftest import MODEL, start_stack
from tests.support import eventually_async, eventually_awaited

CHAT = [{"role": "user", "content": "hello"}]
REQUEST_TIMEOUT_S = 3.0
"""The gateway's request and stream-idle timeouts here."""
HANG_S = 60.0
"""A wait only a hang runs into."""


@pytest.fixture
def fault_stack(tmp_path: Path, model_dir: Path) -> Iterator[Stack]:
    """A private stack with one realistic-speed worker, short TTLs and a 3 s gateway timeout."""
    s = start_stack(
        tmp_path,
        model_dir,
        workers=1,
        mocker_args="--speedup-ratio 1 --seed 1",
        extra_env={f"JETSERVE_{s}_WORKER_TTL_S": "2" for s in ("GATEWAY", "ROUTER", "MOCKER")},
        service_args={
            "gateway": [
                "--request-timeout-s",
                f"{REQUEST_TIMEOUT_S:g}",
                "--stream-idle-timeout-s",
                f"{REQUEST_TIMEOUT_S:g}",
            ]
        },
    )
    try:
        yield s
    finally:
        for child in s.children:  # a test may leave one stopped
            if child.proc.poll() is None:
                os.kill(child.proc.pid, signal.SIGCONT)
        s.stop()


def _client(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0)


def _child(stack: Stack, prefix: str) -> int:
    return next(pid for name, pid in stack.pids().items() if name.startswith(prefix))


async def test_silent_router_gives_504_after_the_timeout(fault_stack: Stack) -> None:
    router = _child(fault_stack, "router")
    os.kill(router, signal.SIGSTOP)
    try:
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=fault_stack.base_url, timeout=HANG_S) as http:
            resp = await http.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 2}
            )
        assert resp.status_code == 504
        assert resp.json()["error"]["code"] == "timeout"  # the gateway's answer, not a hang
        assert time.monotonic() - started >= REQUEST_TIMEOUT_S  # not before the timeout
    finally:
        os.kill(router, signal.SIGCONT)


async def test_killed_last_worker_disappears_and_requests_get_503(fault_stack: Stack) -> None:
    client = _client(fault_stack)
    assert [m.id for m in (await client.models.list()).data] == [MODEL]
    os.kill(_child(fault_stack, "mocker"), signal.SIGKILL)  # no chance to deregister
    await _until_no_models(client, timeout_s=HANG_S)  # TTL 2 s
    async with httpx.AsyncClient(base_url=fault_stack.base_url, timeout=10) as http:
        resp = await http.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 2}
        )
        health = await http.get("/health")
    assert resp.status_code == 503
    assert "retry-after" in resp.headers
    assert health.status_code == 503
    await client.close()


async def test_client_disconnect_cancels_the_request_at_the_worker(fault_stack: Stack) -> None:
    body = {
        "model": MODEL,
        "messages": CHAT,
        "max_tokens": 3000,
        "stream": True,
        "ignore_eos": True,
    }
    async with (
        httpx.AsyncClient(base_url=fault_stack.base_url, timeout=20) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as resp,
    ):
        request_id = resp.headers["x-request-id"]
        seen = 0
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 3:
                break
    mocker_log = fault_stack.run_dir / "mocker-0.log"

    def cancels() -> list[dict[str, object]]:
        events = [_event(line) for line in mocker_log.read_text().splitlines()]
        return [
            e
            for e in events
            if e.get("request_id") == request_id and "cancel" in str(e.get("event", ""))
        ]

    await eventually_async(
        cancels,
        timeout_s=HANG_S,
        interval_s=0.1,
        message=f"the worker never logged a cancel for {request_id}",
    )


async def _until_no_models(client: openai.AsyncOpenAI, timeout_s: float) -> None:
    async def empty() -> bool:
        return not (await client.models.list()).data

    await eventually_awaited(
        empty, timeout_s=timeout_s, interval_s=0.2, message="/v1/models still lists a model"
    )


def _event(line: str) -> dict[str, object]:
    try:
        obj = json.loads(line)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}
