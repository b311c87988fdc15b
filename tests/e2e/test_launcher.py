"""``jetserve up``: one command starts everything, SIGTERM stops everything it started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import MODEL


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone: it has exited
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def test_up_refuses_a_taken_http_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "services.cli",
                "up",
                "--http-port",
                str(port),
                "--run-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert f"HTTP port {port} is already in use" in result.stderr


def test_up_serves_and_sigterm_stops_every_process(tmp_path: Path, model_dir: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "up",
            "--http-port",
            "0",
            "--workers",
            "1",
            "--model-path",
            str(model_dir),
            "--mocker-args",
            "--speedup-ratio 0",
            "--run-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JETSERVE_NAMESPACE": "launchertest"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("JetServe is up: http://127.0.0.1:"), line or proc.stderr.read()
        base = line.split()[3]
        resp = httpx.post(
            f"{base}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            timeout=30,
        )
        assert resp.status_code == 200
        pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
        assert len(pids) == 6  # nats, preprocessor, formatter, router, mocker, gateway
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p for p in pids if _alive(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
