"""A gateway process on a real nats-server with nothing behind it: for what the gateway alone
decides (validation, headers, documents). A valid request for a model nobody registered is a 404
``model_not_found``, which shows that validation let it through."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support import eventually, free_port, nats_server

UNKNOWN_MODEL = "no-such-model"


@dataclass(frozen=True)
class GatewayProcess:
    base_url: str
    log: Path

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def gateway_process(run_dir: Path, *args: str) -> Iterator[GatewayProcess]:
    """``python -m services.gateway`` (with ``args``) on a private nats-server, until exit."""
    with nats_server(run_dir / "js") as (nats_url, _):
        port = free_port()
        log = run_dir / "gateway.log"
        command = [
            *(sys.executable, "-m", "services.gateway", "--nats-url", nats_url),
            *("--namespace", f"e2e{uuid.uuid4().hex[:8]}", "--http-port", str(port)),
            *("--grpc-port", str(free_port()), *args),
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        gateway = GatewayProcess(f"http://127.0.0.1:{port}", log)
        try:
            _wait_live(gateway, proc)
            yield gateway
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_live(gateway: GatewayProcess, proc: subprocess.Popen[bytes]) -> None:
    def live() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited ({proc.returncode}):\n{gateway.tail()}")
        try:
            return httpx.get(f"{gateway.base_url}/live", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    eventually(
        live,
        timeout_s=30,
        interval_s=0.1,
        message=lambda: f"the gateway did not answer /live:\n{gateway.tail()}",
    )
