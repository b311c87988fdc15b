"""The publisher child both message-cost benchmarks drive over NATS (stdlib + nats-py only, so
``faststream_cost`` can import it from its scratch venv)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONTROL = "bench.control"
"""The subject the measuring process asks its publisher child on (JSON requests)."""


async def wait_for_publisher(nc: Any, child: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Return once the publisher child answers a ping on ``CONTROL``; raise if it died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError("the publisher process exited")
        with contextlib.suppress(Exception):
            await nc.request(CONTROL, b'{"ping": true}', timeout=0.5)
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the publisher process did not answer")


@contextlib.contextmanager
def publisher_child(module: str, args: list[str], cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m module *args`` as the publisher child; waited for after the block (10 s),
    terminated if it is still running then or the block failed."""
    child = subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd)
    try:
        yield child
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.terminate()
            child.wait(timeout=10)
