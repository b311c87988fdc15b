"""The publisher child both message-cost benchmarks drive over NATS (stdlib + nats-py only, so
``faststream_cost`` can import it from its scratch venv)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
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
