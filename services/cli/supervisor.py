"""What ``jetserve up`` does when one of its processes exits: restart it after a backoff, as
compose's restart policy does, or give up on a crash loop. Pure: the caller passes the time
and carries out the decision.

A process that exits is restarted after ``backoff_s`` (0.1 s, where Docker's restart policy
starts too; doubling up to ``max_backoff_s`` for one that keeps failing); one that stayed up for
``healthy_after_s`` starts again from the first backoff. ``max_restarts`` exits within
``window_s`` is a crash loop: the launcher stops everything and says which process looped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    backoff_s: float = 0.1
    max_backoff_s: float = 8.0
    healthy_after_s: float = 30.0
    """Up this long, a process counts as healthy again: the next restart waits ``backoff_s``."""
    max_restarts: int = 5
    window_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Restart:
    """Start the process again at ``at`` (monotonic seconds); it is restart number ``count``."""

    at: float
    count: int


@dataclass(frozen=True, slots=True)
class GiveUp:
    """A crash loop: ``exits`` exits within ``window_s``."""

    exits: int
    window_s: float


@dataclass
class ProcessHistory:
    """One supervised process: when it started and when it exited lately."""

    policy: RestartPolicy
    started_at: float
    restarts: int = 0
    _exits: deque[float] = field(default_factory=deque)
    _backoff_s: float = 0.0

    def on_exit(self, now: float) -> Restart | GiveUp:
        """The process has exited at ``now``: when to start it again, or give up."""
        policy = self.policy
        exits = self._exits
        exits.append(now)
        while exits and exits[0] < now - policy.window_s:
            exits.popleft()
        if len(exits) >= policy.max_restarts:
            return GiveUp(len(exits), policy.window_s)
        if now - self.started_at >= policy.healthy_after_s or not self._backoff_s:
            self._backoff_s = policy.backoff_s
        else:
            self._backoff_s = min(self._backoff_s * 2, policy.max_backoff_s)
        self.restarts += 1
        return Restart(now + self._backoff_s, self.restarts)

    def on_start(self, now: float) -> None:
        self.started_at = now
