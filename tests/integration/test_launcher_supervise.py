"""``jetserve up``'s supervision loop on real child processes (no NATS): a process that exits
is started again; one that keeps exiting is a crash loop that ends the watch with its reason."""

from __future__ import annotations

import io
import re
import sys
import threading
from pathlib import Path

import pytest

from services.cli.launcher import supervise
from services.cli.stack import Stack, StackConfig
from services.cli.supervisor import RestartPolicy
from tests.support import eventually

FAST = RestartPolicy(backoff_s=0.05, max_backoff_s=0.1, max_restarts=3, window_s=30.0)

pytestmark = pytest.mark.timeout(30)


def stack_with(tmp_path: Path, name: str, code: str) -> Stack:
    stack = Stack(StackConfig(run_dir=tmp_path))
    stack._popen(name, [sys.executable, "-c", code])
    return stack


def test_a_process_that_exits_once_is_started_again(tmp_path: Path) -> None:
    marker = tmp_path / "ran-once"
    code = (
        "import pathlib, sys, time\n"
        f"m = pathlib.Path({str(marker)!r})\n"
        "if not m.exists():\n    m.touch(); sys.exit(9)\n"
        "time.sleep(60)\n"
    )
    stack = stack_with(tmp_path, "flaky", code)
    first = stack.children[0].proc.pid
    stop, out = threading.Event(), io.StringIO()
    watcher = threading.Thread(target=lambda: result.append(supervise(stack, stop, FAST, out)))
    result: list[tuple[int, str]] = []
    watcher.start()
    try:
        eventually(
            lambda: "restarted" in out.getvalue(),
            interval_s=0.05,
            message="the launcher never restarted the process",
        )
        child = stack.children[0]
        assert child.proc.pid != first
        assert child.proc.poll() is None
        assert int((tmp_path / "flaky.pid").read_text()) == child.proc.pid
    finally:
        stop.set()
        watcher.join(5)
        stack.stop(timeout_s=2)
    assert result == [(0, "stopped by signal")]
    said = out.getvalue()
    assert re.search(r"jetserve up: flaky exited with code 9; restart 1 in 0\.\ds", said), said
    assert "flaky restarted (pid" in said
    assert "flaky exited with code 9" in (tmp_path / "flaky.log").read_text()


def test_a_process_that_keeps_exiting_is_a_crash_loop(tmp_path: Path) -> None:
    stack = stack_with(tmp_path, "crasher", "import sys; print('boom'); sys.exit(3)")
    out = io.StringIO()
    try:
        code, reason = supervise(stack, threading.Event(), FAST, out)
    finally:
        stack.stop(timeout_s=2)
    assert code == 1
    assert reason.startswith("crasher exited 3 times within 30s (last code 3): a crash loop")
    assert "boom" in reason  # the tail of its log
    assert out.getvalue().count("restarted") == 2
