"""``jetserve top`` against a running stack: what ``--once`` prints matches the stack's own
``/metrics`` and worker registry while streaming requests are in flight; the live screen, in a
pseudo-terminal, redraws and quits on ``q``."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from services.cli import runrecord
from services.cli.stack import Stack, free_port
from services.cli.top.stats import Samples, parse
from tests.e2e.conftest import MODEL, running_stack
from tests.e2e.top_tables import top_tables

WINDOW_S = 10.0
"""``top --once``'s window. The test's requests (about half a second's work) must all fall inside
it, so it is long enough for a busy machine; the long streams (4000 tokens, over 20 s at real
speed, longer when busy) outlast it."""
HANG_S = 60.0
"""A wait only a hang runs into."""
SHORT_REQUESTS = 6
LONG_STREAMS = 3
CHAT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me a long story about the sea and its ships."}
]


@pytest.fixture(scope="module")
def top_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """Two mockers at real speed (streams take seconds), a KV router with its own /metrics."""
    with running_stack(
        tmp_path_factory.mktemp("top"),
        model_dir,
        router_mode="kv",
        mocker_args="--speedup-ratio 1 --seed 1",
        service_args={"router": ["--metrics-port", str(free_port())]},
        log_level="INFO",
    ) as stack:
        yield stack


def _scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return parse(resp.read().decode())


async def _open_stream(client: openai.AsyncOpenAI, max_tokens: int) -> AsyncIterator[object]:
    """A streaming request whose first chunk has arrived (so it is in flight everywhere); it
    runs to ``max_tokens`` (no early EOS), which at real speed takes ~6 ms a token."""
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=max_tokens,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = stream.__aiter__()
    await chunks.__anext__()
    return chunks


async def test_top_once_matches_the_stacks_own_metrics(top_stack: Stack) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    top = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "top", "--once", "--window", str(WINDOW_S),
        "--run-dir", str(top_stack.run_dir),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert top.stderr is not None
    line = await asyncio.wait_for(top.stderr.readline(), HANG_S)
    assert b"gathering" in line, line
    client = openai.AsyncOpenAI(base_url=f"{top_stack.base_url}/v1", api_key="x", max_retries=0)
    longs = [await _open_stream(client, 4000) for _ in range(LONG_STREAMS)]
    for _ in range(SHORT_REQUESTS):
        stream = await client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=8, stream=True
        )
        _ = [chunk async for chunk in stream]
    out, err = await asyncio.wait_for(top.communicate(), WINDOW_S + HANG_S)
    urls = runrecord.read(top_stack.run_dir).metrics
    gateway = _scrape(urls["gateway"])
    router = _scrape(urls["router"])
    for chunks in longs:
        await chunks.aclose()  # type: ignore[attr-defined]
    await client.close()
    assert top.returncode == 0, err.decode()
    text = out.decode()
    tables = top_tables(text)
    span_s = float(re.search(r"window (\d+\.\d)s", text).group(1))  # type: ignore[union-attr]

    (g,) = tables["Gateway"]
    answered = gateway.total("jetserve_http_requests_total", endpoint="/v1/chat/completions")
    assert float(g["requests"]) == answered == SHORT_REQUESTS
    assert float(g["req/s"]) == pytest.approx(SHORT_REQUESTS / span_s, abs=0.3)
    assert float(g["in flight"]) == gateway.total("jetserve_gateway_concurrent_requests")
    assert float(g["in flight"]) == LONG_STREAMS
    assert g["TTFT p50"].endswith("ms")

    workers = tables["Workers"]
    assert sorted(w["model"] for w in workers) == [MODEL] * top_stack.config.workers
    assert sum(float(w["tok/s"]) for w in workers) > 0
    (m,) = tables["Models"]
    assert int(m["workers"]) == top_stack.config.workers
    assert int(m["running"]) == LONG_STREAMS

    (r,) = tables["Routers"]
    decisions = router.total("jetserve_router_decisions_total")
    assert decisions == SHORT_REQUESTS + LONG_STREAMS
    assert float(r["decisions/s"]) * span_s == pytest.approx(decisions, abs=1.0)
    index_blocks = router.total("jetserve_router_index_blocks")
    assert index_blocks
    assert float(r["index blocks"]) == pytest.approx(index_blocks, rel=0.5)
    assert r["event lag"] != "n/a"


def _read_until(fd: int, done: Callable[[bytes], bool], timeout_s: float) -> bytes:
    """What the terminal shows until ``done(shown)`` holds, the child closes its side, or
    ``timeout_s`` (a hang guard) passes: bounded reads of the pty's master side."""
    got = b""
    deadline = time.monotonic() + timeout_s
    while not done(got) and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], min(left, 0.2))
        if ready:
            try:
                got += os.read(fd, 65536)
            except OSError:  # the child closed its side
                break
    return got


def test_the_live_screen_redraws_and_quits_on_q(top_stack: Stack) -> None:
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "160", "LINES": "50"}
    top = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "top", "--run-dir", str(top_stack.run_dir)],
        stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    try:  # two frames: it redraws (about once a second; however long a busy machine takes)
        shown = _read_until(master, lambda got: got.count(b"jetserve top") >= 2, HANG_S)
        os.write(master, b"q")
        code = top.wait(timeout=HANG_S)
    finally:
        if top.poll() is None:
            top.kill()
            top.wait(timeout=5)
        os.close(master)
    assert code == 0
    assert shown.count(b"jetserve top") >= 2, shown[-2000:]  # redrawn
    assert b"Workers" in shown
