"""``jetserve top`` against a running stack: what ``--once`` prints matches the stack's own
``/metrics`` and worker registry while streaming requests are in flight; with an admission policy
its classes and tenants match the router's own figures; the live screen, in a pseudo-terminal,
redraws and quits on ``q``."""

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
ADMISSION_WINDOW_S = 5.0
"""``top --once``'s window for the admission stack: its requests take well under a second."""
POLICY = """\
default_class: regular
class_header: true
classes:
  premium: {weight: 4}
  regular: {weight: 1}
tenants:
  small: {tokens_per_minute: 300}
"""


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


@pytest.fixture(scope="module")
def admission_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """Undelayed mockers, a router with its own /metrics, an admission policy (``POLICY``)."""
    run_dir = tmp_path_factory.mktemp("top-admission")
    policy = run_dir / "admission.yaml"
    policy.write_text(POLICY)
    with running_stack(
        run_dir,
        model_dir,
        admission_config=policy,
        service_args={"router": ["--metrics-port", str(free_port())]},
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


async def _start_top_once(stack: Stack, window_s: float) -> asyncio.subprocess.Process:
    """``top --once`` on ``stack``, once it has subscribed (it says it is gathering)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    top = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "top", "--once", "--window", str(window_s),
        "--run-dir", str(stack.run_dir),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert top.stderr is not None
    line = await asyncio.wait_for(top.stderr.readline(), HANG_S)
    assert b"gathering" in line, line
    return top


async def test_top_once_matches_the_stacks_own_metrics(top_stack: Stack) -> None:
    top = await _start_top_once(top_stack, WINDOW_S)
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
    assert "Classes" not in tables  # no admission policy: today's screen
    assert "Tenants" not in tables


async def test_top_once_shows_admission_as_the_router_counts_it(
    admission_stack: Stack,
) -> None:
    top = await _start_top_once(admission_stack, ADMISSION_WINDOW_S)
    client = openai.AsyncOpenAI(
        base_url=f"{admission_stack.base_url}/v1", api_key="x", max_retries=0
    )
    small = {"x-tenant-id": "small", "x-dynamo-meta-policy-class": "premium"}
    refused = 0
    for _ in range(30):  # the small tenant's 300 tokens a minute last a few requests
        try:
            await client.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=8, extra_headers=small
            )
        except openai.RateLimitError:
            refused += 1
            break
    for _ in range(2):
        await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8)
    await client.close()
    out, err = await asyncio.wait_for(top.communicate(), ADMISSION_WINDOW_S + HANG_S)
    router = _scrape(runrecord.read(admission_stack.run_dir).metrics["router"])
    assert top.returncode == 0, err.decode()
    tables = top_tables(out.decode())
    assert refused == 1
    classes = {row["class"]: row for row in tables["Classes"]}
    assert sorted(classes) == ["premium", "regular"]
    served = router.by_label("jetserve_router_served_uncached_tokens_total", "policy_class")
    shares = {c: float(row["share"].rstrip("%")) for c, row in classes.items()}
    assert shares["premium"] == pytest.approx(100 * served["premium"] / sum(served.values()), abs=1)
    (t,) = tables["Tenants"]
    spent = router.total("jetserve_router_tenant_tokens_last_minute", tenant="small")
    assert (t["tenant"], t["budget/min"], t["429s"]) == ("small", "300", "1")
    assert float(t["tokens/min"]) == spent


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
