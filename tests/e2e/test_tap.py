"""``jetserve tap`` shows one request's whole path across the services, by request id."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from typing import Any

import openai

from services.cli.stack import Stack
from tests.e2e.conftest import MODEL

TAP_TIMEOUT_S = 60


async def _start_tap(stack: Stack, *args: str) -> asyncio.subprocess.Process:
    """``python -m services.cli tap ARGS…`` against the stack; returns once it listens."""
    env = {
        **os.environ,
        "JETSERVE_NATS_URL": stack.nats_url,
        "JETSERVE_NAMESPACE": stack.config.namespace,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli",
        "tap",
        "--timeout",
        str(TAP_TIMEOUT_S),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    line = await asyncio.wait_for(proc.stderr.readline(), 15)
    assert b"listening on" in line, line
    return proc


async def _read_until_done(proc: asyncio.subprocess.Process, request_id: str) -> list[Any]:
    """Tap lines until this request's final ``ResponseChunk`` (then a little more)."""
    assert proc.stdout is not None
    lines: list[Any] = []
    async with asyncio.timeout(20):
        while True:
            raw = await proc.stdout.readline()
            assert raw, "tap exited early"
            lines.append(json.loads(raw))
            fields = lines[-1]["fields"]
            if (
                lines[-1]["type"] == "ResponseChunk"
                and fields.get("request_id") == request_id
                and fields["done"]
            ):
                return lines


async def test_tap_shows_the_whole_path_of_one_request(
    stack: Stack, client: openai.AsyncOpenAI
) -> None:
    ns = stack.config.namespace
    request_id = f"tap{uuid.uuid4().hex[:12]}"
    # The namespace's subjects, plus reply inboxes (where StreamOpened travels).
    tap = await _start_tap(stack, f"{ns}.v1.>", "_INBOX.>")
    try:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hello there"}],
            max_tokens=6,
            stream=True,
            extra_headers={"X-Request-Id": request_id},
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        lines = await _read_until_done(tap, request_id)
    finally:
        tap.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(tap.wait(), 10)
    assert code == 0

    mine = [ln for ln in lines if ln["fields"].get("request_id") == request_id]
    kinds = [ln["type"] for ln in mine]
    assert all(set(ln) >= {"subject", "type", "time", "fields"} for ln in mine)

    def first(kind: str, subject: str | None = None) -> int:
        return next(
            i
            for i, ln in enumerate(mine)
            if ln["type"] == kind and (subject is None or ln["subject"] == subject)
        )

    preprocess = first("Preprocess", f"{ns}.v1.preprocess")
    # Queue-group handshake (StreamOpen + StreamOpened) or, once the preprocessor knows a
    # formatter, a direct StreamOpen to ``formatter.<id>.open`` with no answer (decision 013).
    opened = first("StreamOpen")
    open_subject = mine[opened]["subject"]
    assert open_subject == f"{ns}.v1.formatter.open" or (
        open_subject.startswith(f"{ns}.v1.formatter.") and open_subject.endswith(".open")
    )
    routed = first("Generate", f"{ns}.v1.router.generate")
    worker_gen = next(
        i
        for i, ln in enumerate(mine)
        if ln["type"] == "Generate" and ln["subject"].startswith(f"{ns}.v1.worker.")
    )
    worker_id = mine[worker_gen]["fields"]["worker_id"]
    assert mine[worker_gen]["subject"] == f"{ns}.v1.worker.{worker_id}.generate"
    assert mine[routed]["fields"]["worker_id"] is None
    stream_to = mine[routed]["fields"]["stream_to"]
    if open_subject == f"{ns}.v1.formatter.open":
        stream_opened = first("StreamOpened")
        assert opened < stream_opened < routed
        assert mine[stream_opened]["fields"]["stream_to"] == stream_to
    else:
        formatter_id = open_subject.split(".")[-2]
        assert stream_to == f"{ns}.v1.stream.{formatter_id}.{request_id}"

    batches = [ln for ln in mine if ln["type"] == "TokenBatch"]
    assert batches
    assert all(b["subject"] == stream_to for b in batches)
    assert sum(len(b["fields"]["token_ids"]) for b in batches) == 6
    assert batches[-1]["fields"]["finish_reason"] == "length"
    assert {b["fields"]["worker_id"] for b in batches} == {worker_id}

    chunks = [ln for ln in mine if ln["type"] == "ResponseChunk"]
    assert chunks[-1]["fields"]["done"] is True
    assert chunks[-1]["fields"]["data"].endswith("data: [DONE]\n\n")  # bytes shown as text
    assert _sse_text("".join(c["fields"]["data"] for c in chunks)) == text

    last_batch = kinds.index("TokenBatch") + len(batches) - 1
    assert preprocess < opened < routed < worker_gen < last_batch
    assert worker_gen < kinds.index("TokenBatch") <= last_batch < len(kinds) - 1

    # The router publishes a RouteDecision per request once KV-aware routing is in; when it
    # does, tap must show it, naming the worker the request went to.
    decisions = [ln for ln in mine if ln["type"] == "RouteDecision"]
    if decisions:
        assert decisions[0]["subject"] == f"{ns}.v1.decisions"
        assert decisions[0]["fields"]["worker_id"] == worker_id


async def test_tap_count_exits_after_n_messages(stack: Stack, client: openai.AsyncOpenAI) -> None:
    tap = await _start_tap(stack, "--count", "1", "preprocess")  # relative: <ns>.v1.preprocess
    assert tap.stdout is not None
    await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )
    assert await asyncio.wait_for(tap.wait(), 10) == 0
    lines = (await tap.stdout.read()).splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["subject"] == f"{stack.config.namespace}.v1.preprocess"


def _sse_text(data: str) -> str:
    """The content deltas of OpenAI chat SSE frames."""
    text = ""
    for frame in data.split("\n\n"):
        payload = frame.removeprefix("data: ")
        if payload and payload != "[DONE]":
            choices = json.loads(payload)["choices"]
            text += choices[0]["delta"].get("content") or "" if choices else ""
    return text
