"""``jetserve up``'s watch over a running stack: restart what exits (``supervisor.py`` decides
when), until Ctrl-C/SIGTERM or a crash loop; say which ended it.

Each restart is one line on the launcher's stderr and one appended to the process's own log:
``jetserve up: mocker-0 exited with code -9; restart 1 in 0.1s``, then ``… restarted (pid N)``
and, once it has started, ``… ready again after 1.2s``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from services.cli.stack import Child, Stack
from services.cli.supervisor import GiveUp, ProcessHistory, Restart, RestartPolicy

POLL_S = 0.2


def supervise(
    stack: Stack,
    stop: threading.Event,
    policy: RestartPolicy | None = None,
    out: TextIO = sys.stderr,
) -> tuple[int, str]:
    """Watch until ``stop`` is set (exit code 0) or a process loops (1); the reason, said."""
    policy = policy or RestartPolicy()
    now = time.monotonic()
    histories = {c.name: ProcessHistory(policy, started_at=now) for c in stack.children}
    pending: dict[str, tuple[Child, Restart]] = {}
    starting: dict[str, float] = {}  # restarted, not ready yet: since when
    while not stop.wait(POLL_S):
        now = time.monotonic()
        if starting:
            waiting = {c.name for c in stack.not_ready()}
            for child in stack.children:
                if child.name in starting and child.name not in waiting:
                    took = now - starting.pop(child.name)
                    _say(out, child, f"{child.name} ready again after {took:.1f}s")
        for child in stack.exited_children():
            if child.name in pending:
                continue
            decision = histories[child.name].on_exit(now)
            code = child.proc.returncode
            if isinstance(decision, GiveUp):
                reason = (
                    f"{child.name} exited {decision.exits} times within "
                    f"{decision.window_s:.0f}s (last code {code}): a crash loop\n{child.tail()}"
                )
                _say(out, child, reason.splitlines()[0])
                return 1, reason
            pending[child.name] = (child, decision)
            delay = max(0.0, decision.at - now)
            _say(
                out,
                child,
                f"{child.name} exited with code {code}; restart {decision.count} in {delay:.1f}s",
            )
        for name, (child, decision) in list(pending.items()):
            if now >= decision.at:
                fresh = stack.restart(child)
                histories[name].on_start(now)
                del pending[name]
                if fresh.notifies:
                    starting[name] = now
                _say(out, fresh, f"{name} restarted (pid {fresh.proc.pid})")
    return 0, "stopped by signal"


def _say(out: TextIO, child: Child, line: str) -> None:
    print(f"jetserve up: {line}", file=out, flush=True)
    child.note(f"jetserve up: {line}")
