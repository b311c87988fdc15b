"""``jetserve up`` for disaggregated serving, typed as a user types it: ``--prefill-workers``,
``--decode-workers`` and ``--data-parallel-size`` start workers of those roles (their cards say so
on ``/v1/models`` and in ``jetserve top``), the router's disaggregation flags reach the router, and
a stack that cannot serve is refused at the command line.

What the request path does with the roles is ``test_disagg.py``'s; this file checks the launcher.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_launcher import _start_up, _up, _up_line
from tests.e2e.top_tables import top_tables
from tests.support import eventually

READ_TIMEOUT_S = 15.0
"""Both workers register within a moment of the line saying the stack is up."""


def _workers_on_models(base: str) -> dict[str, Any]:
    """``/v1/models``' ``jetserve`` extension of the one model, once both workers are listed."""

    def both_listed() -> dict[str, Any] | None:
        (model,) = httpx.get(f"{base}/models", timeout=10).json()["data"]
        listed: dict[str, Any] = model["jetserve"]
        return listed if sum(listed["workers"].values()) >= 2 else None

    return eventually(
        both_listed,
        timeout_s=READ_TIMEOUT_S,
        interval_s=0.1,
        message="/v1/models never listed both workers",
    )


def _roles_in_top(run_dir: Path) -> list[str]:
    """The role cells of ``jetserve top --once``'s Workers table."""
    top = [sys.executable, "-m", "services.cli", "top", "--once", "--window", "0.5"]
    done = subprocess.run(
        [*top, "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    roles = [row["role"] for row in top_tables(done.stdout)["Workers"]]
    return sorted(roles)


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_up_starts_prefill_and_decode_workers_that_show_their_roles(
    tmp_path: Path, model_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    proc = _start_up(
        {"JETSERVE_NAMESPACE": "disaggup"},
        *("--workers", "0", "--prefill-workers", "1", "--decode-workers", "1"),
        *("--data-parallel-size", "2", "--router-conditional-disagg", "--router-enforce-disagg"),
        *("--embedders", "0", "--model-path", str(model_dir), "--run-dir", str(run_dir)),
    )
    try:
        line = _up_line(proc)
        assert "(model Qwen/Qwen3-0.6B, 1 prefill + 1 decode mocker workers, 2 data-parallel " in (
            line
        ), line
        pids = {p.stem: int(p.read_text()) for p in run_dir.glob("*.pid")}
        workers = sorted(name for name in pids if name.startswith("mocker"))
        assert workers == ["mocker-decode-0", "mocker-prefill-0"]
        roles = {name: _cmdline(pids[name]) for name in workers}
        assert [cmd[cmd.index("--role") + 1] for cmd in roles.values()] == ["decode", "prefill"]

        assert _workers_on_models(line.split()[3]) == {
            "workers": {"both": 0, "prefill": 1, "decode": 1},
            "dp_ranks": 4,
        }
        assert _roles_in_top(run_dir) == ["decode dp 2", "prefill dp 2"]
        router = _cmdline(pids["router"])
        assert {"--router-conditional-disagg", "--enforce-disagg"} <= set(router)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--workers", "0", "--prefill-workers", "2"],
            "--prefill-workers 2 needs workers that decode",
        ),
        (["--workers", "0"], "--workers 0 leaves no worker to serve the model"),
        (
            ["--engine", "hf", "--prefill-workers", "1", "--decode-workers", "1"],
            "--engine hf runs aggregated single-rank workers only",
        ),
        (["--prefill-workers", "-1"], "argument --prefill-workers: must be >= 0"),
    ],
)
def test_up_refuses_a_fleet_that_cannot_serve_with_a_usage_error(
    args: list[str], message: str
) -> None:
    result = subprocess.run(_up(*args), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
