"""``jetserve up``: one command starts everything, SIGTERM stops everything it started and
removes its temp run dir."""

from __future__ import annotations

import os
import re
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


def _up(*args: str) -> list[str]:
    return [sys.executable, "-m", "services.cli", "up", *args]


def _start_up(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """``jetserve up`` on free ports with an undelayed mocker, output piped."""
    return subprocess.Popen(
        _up("--http-port", "0", "--grpc-port", "0", "--mocker-speedup-ratio", "0", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def _up_line(proc: subprocess.Popen[str]) -> str:
    """The launcher's first line, checked to say it is up."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    line = proc.stdout.readline()
    assert line.startswith("JetServe is up: http://127.0.0.1:"), line or proc.stderr.read()
    return line


def test_up_refuses_a_taken_http_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            _up("--http-port", str(port), "--run-dir", str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert f"HTTP port {port} is already in use" in result.stderr
    assert f"logs kept in {tmp_path}" in result.stderr


def test_up_rejects_a_bad_pass_through_value_naming_the_flag() -> None:
    result = subprocess.run(
        _up("--router-kv-overlap-score-weight", "-1"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--router-kv-overlap-score-weight" in result.stderr


def test_up_serves_and_sigterm_stops_every_process_and_removes_its_run_dir(
    tmp_path: Path, model_dir: Path
) -> None:
    # the temp run dir goes under tmp_path, so the test can see it is removed
    env = {"JETSERVE_NAMESPACE": "launchertest", "TMPDIR": str(tmp_path)}
    proc = _start_up(env, "--workers", "1", "--model-path", str(model_dir), "--router-mode", "kv")
    try:
        line = _up_line(proc)
        base = line.split()[3]
        logs_line = proc.stdout.readline()
        assert logs_line.startswith("logs and pids: "), logs_line
        run_dir = Path(logs_line.split()[3])
        assert run_dir.parent == tmp_path
        resp = httpx.post(
            f"{base}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            timeout=30,
        )
        assert resp.status_code == 200
        pids = [int(p.read_text()) for p in run_dir.glob("*.pid")]
        assert len(pids) == 7  # nats, preprocessor, formatter, router, mocker, embedder, gateway
        router_cmdline = Path(f"/proc/{int((run_dir / 'router.pid').read_text())}/cmdline")
        assert b"--router-mode\0kv" in router_cmdline.read_bytes()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p for p in pids if _alive(p)] == []
        assert not run_dir.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_restarts_a_killed_mocker_and_goes_on_serving(tmp_path: Path, model_dir: Path) -> None:
    """SIGKILL of one mocker: the launcher starts it again (a line on its stderr and in the
    mocker's log, and another once it is ready), every service stays up, and requests are
    served."""
    run_dir = tmp_path / "run"
    proc = _start_up(
        {"JETSERVE_NAMESPACE": "restarttest"},
        *("--workers", "2", "--model-path", str(model_dir), "--run-dir", str(run_dir)),
    )
    try:
        line = _up_line(proc)
        base = line.split()[3]
        pid_file = run_dir / "mocker-0.pid"
        killed = int(pid_file.read_text())
        others = {p.name: int(p.read_text()) for p in run_dir.glob("*.pid") if p != pid_file}
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            fresh = int(pid_file.read_text())
            if fresh != killed and _alive(fresh):
                break
            time.sleep(0.1)
        assert fresh != killed, "mocker-0 was not started again"
        assert _alive(fresh)
        assert all(_alive(pid) for pid in others.values()), others
        log = (run_dir / "mocker-0.log").read_text()
        assert "jetserve up: mocker-0 exited with code -9; restart 1 in" in log
        assert f"jetserve up: mocker-0 restarted (pid {fresh})" in log
        deadline = time.monotonic() + 15  # it says so once the new mocker has started
        while "mocker-0 ready again after" not in log and time.monotonic() < deadline:
            time.sleep(0.1)
            log = (run_dir / "mocker-0.log").read_text()
        assert re.search(r"jetserve up: mocker-0 ready again after \d+\.\ds", log), log[-2000:]
        for _ in range(6):
            resp = httpx.post(
                f"{base}/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                },
                timeout=30,
            )
            assert resp.status_code == 200, resp.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert "mocker-0 exited with code -9; restart 1" in stderr
        assert "stopping (stopped by signal)" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_runs_replicas_of_each_stage_under_numbered_names(
    tmp_path: Path, model_dir: Path
) -> None:
    """``--routers 2 --formatters 2 --preprocessors 2``: six stage processes, each with its own
    pid file and log, serving; SIGTERM stops them all."""
    run_dir = tmp_path / "run"
    proc = _start_up(
        {"JETSERVE_NAMESPACE": "replicatest"},
        *("--workers", "1", "--routers", "2", "--formatters", "2", "--preprocessors", "2"),
        *("--model-path", str(model_dir), "--run-dir", str(run_dir)),
    )
    try:
        line = _up_line(proc)
        assert "2 preprocessors, 2 routers, 2 formatters" in line
        base = line.split()[3]
        pids = {p.stem: int(p.read_text()) for p in run_dir.glob("*.pid")}
        stages = ("preprocessor", "router", "formatter")
        assert sorted(pids) == sorted(
            ["nats", "gateway", "mocker-0", "embedder-0"]
            + [f"{s}-{i}" for s in stages for i in (0, 1)]
        )
        assert all((run_dir / f"{name}.log").is_file() for name in pids)
        for _ in range(4):
            resp = httpx.post(
                f"{base}/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                },
                timeout=30,
            )
            assert resp.status_code == 200, resp.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [name for name, p in pids.items() if _alive(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
