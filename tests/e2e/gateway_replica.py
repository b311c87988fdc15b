"""One more gateway on a running stack's bus (``python -m services.gateway`` with its own ports
and the command-line flags a test gives it), for what several replicas must share."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.cli.stack import Stack
from tests.support import eventually, free_port


@dataclass(frozen=True)
class Replica:
    base_url: str
    log: Path

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def gateway_replica(stack: Stack, log: Path, *args: str) -> Iterator[Replica]:
    """A gateway on ``stack``'s NATS and namespace, ready (``/health`` 200) until exit."""
    with gateway_on(stack.nats_url, stack.config.namespace, log, *args) as replica:
        yield replica


@contextmanager
def gateway_on(
    nats_url: str, namespace: str, log: Path, *args: str, ready: str = "/health"
) -> Iterator[Replica]:
    """A gateway on ``nats_url`` in ``namespace``, until exit, once ``ready`` answers 200
    (``/live`` for a bus with no workers)."""
    port = free_port()
    env = {**os.environ, "JETSERVE_NATS_URL": nats_url, "JETSERVE_NAMESPACE": namespace}
    command = [sys.executable, "-m", "services.gateway", "--http-port", str(port)]
    command += ["--grpc-port", str(free_port()), *args]
    replica = Replica(f"http://127.0.0.1:{port}", log)
    with log.open("ab") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited ({proc.returncode}):\n{replica.tail()}")
            try:
                return httpx.get(f"{replica.base_url}{ready}", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(
            healthy, timeout_s=60, interval_s=0.1, message=lambda: f"not up:\n{replica.tail()}"
        )
        yield replica
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
