"""The launcher's restart policy: backoff, its reset after a healthy run, the crash loop."""

from __future__ import annotations

import pytest

from services.cli.supervisor import GiveUp, ProcessHistory, Restart, RestartPolicy

POLICY = RestartPolicy(
    backoff_s=0.5, max_backoff_s=4.0, healthy_after_s=30.0, max_restarts=5, window_s=60.0
)


def test_the_first_exit_restarts_after_the_first_backoff() -> None:
    history = ProcessHistory(POLICY, started_at=0.0)
    assert history.on_exit(10.0) == Restart(at=10.5, count=1)


def test_quick_exits_double_the_backoff_up_to_the_cap() -> None:
    delays = []
    now = 100.0
    policy = RestartPolicy(backoff_s=0.5, max_backoff_s=4.0, max_restarts=99, window_s=60.0)
    history = ProcessHistory(policy, started_at=now)
    for _ in range(6):
        decision = history.on_exit(now)
        assert isinstance(decision, Restart)
        delays.append(decision.at - now)
        now = decision.at + 1.0  # started again, up for a second
        history.on_start(decision.at)
    assert delays == pytest.approx([0.5, 1.0, 2.0, 4.0, 4.0, 4.0])


def test_a_healthy_run_starts_again_from_the_first_backoff() -> None:
    history = ProcessHistory(POLICY, started_at=0.0)
    first = history.on_exit(1.0)
    assert isinstance(first, Restart)
    history.on_start(first.at)
    second = history.on_exit(first.at + 0.2)
    assert isinstance(second, Restart)
    assert second.at - (first.at + 0.2) == pytest.approx(1.0)
    history.on_start(second.at)
    third = history.on_exit(second.at + 31.0)  # up longer than healthy_after_s
    assert isinstance(third, Restart)
    assert (third.at - (second.at + 31.0), third.count) == (pytest.approx(0.5), 3)


def test_max_restarts_exits_within_the_window_is_a_crash_loop() -> None:
    history = ProcessHistory(POLICY, started_at=0.0)
    decisions = [history.on_exit(float(t)) for t in (1, 2, 3, 4, 5)]
    assert all(isinstance(d, Restart) for d in decisions[:4])
    assert decisions[4] == GiveUp(exits=5, window_s=60.0)


def test_exits_spread_wider_than_the_window_never_give_up() -> None:
    history = ProcessHistory(POLICY, started_at=0.0)
    decisions = [history.on_exit(t * 20.0) for t in range(1, 20)]  # one exit every 20 s
    assert all(isinstance(d, Restart) for d in decisions)
