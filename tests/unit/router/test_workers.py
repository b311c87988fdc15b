"""Worker tracking: which workers' routing state to drop when they leave the registry."""

from __future__ import annotations

from services.router.workers import WorkerTracker

TTL_S = 10.0


def test_a_live_worker_is_kept() -> None:
    tracker = WorkerTracker(TTL_S)
    assert tracker.departed({"w1"}, {"w1"}, now=0.0) == []


def test_a_registered_worker_that_is_gone_is_dropped_at_once() -> None:
    tracker = WorkerTracker(TTL_S)
    tracker.departed({"w1"}, {"w1"}, now=0.0)
    assert tracker.departed({"w1"}, set(), now=0.1) == ["w1"]


def test_a_never_registered_worker_is_kept_for_a_ttl() -> None:
    tracker = WorkerTracker(TTL_S)
    assert tracker.departed({"w1"}, set(), now=0.0) == []
    assert tracker.departed({"w1"}, set(), now=TTL_S - 0.1) == []


def test_a_never_registered_worker_is_dropped_after_a_ttl() -> None:
    tracker = WorkerTracker(TTL_S)
    tracker.departed({"w1"}, set(), now=0.0)
    assert tracker.departed({"w1"}, set(), now=TTL_S) == ["w1"]


def test_a_worker_that_registers_during_its_grace_is_kept() -> None:
    tracker = WorkerTracker(TTL_S)
    tracker.departed({"w1"}, set(), now=0.0)
    tracker.departed({"w1"}, {"w1"}, now=1.0)
    assert tracker.departed({"w1"}, {"w1"}, now=TTL_S + 1.0) == []


def test_a_worker_that_registered_during_its_grace_is_dropped_at_once_when_gone() -> None:
    tracker = WorkerTracker(TTL_S)
    tracker.departed({"w1"}, set(), now=0.0)
    tracker.departed({"w1"}, {"w1"}, now=1.0)
    assert tracker.departed({"w1"}, set(), now=2.0) == ["w1"]


def test_a_worker_that_comes_back_after_its_drop_is_kept() -> None:
    tracker = WorkerTracker(TTL_S)
    tracker.departed({"w1"}, {"w1"}, now=0.0)
    tracker.departed({"w1"}, set(), now=1.0)
    assert tracker.departed({"w1"}, {"w1"}, now=2.0) == []


def test_a_worker_that_comes_back_and_leaves_again_is_dropped_again() -> None:
    tracker = WorkerTracker(TTL_S)
    tracker.departed({"w1"}, {"w1"}, now=0.0)
    tracker.departed({"w1"}, set(), now=1.0)
    tracker.departed({"w1"}, {"w1"}, now=2.0)
    assert tracker.departed({"w1"}, set(), now=3.0) == ["w1"]


def test_late_events_after_a_drop_get_a_fresh_grace() -> None:
    """A dropped worker's stragglers (state without a card) wait a TTL like a newcomer's."""
    tracker = WorkerTracker(TTL_S)
    tracker.departed({"w1"}, {"w1"}, now=0.0)
    tracker.departed({"w1"}, set(), now=1.0)
    assert tracker.departed({"w1"}, set(), now=2.0) == []


def test_grace_restarts_when_an_unregistered_workers_state_went_away_meanwhile() -> None:
    tracker = WorkerTracker(TTL_S)
    tracker.departed({"w1"}, set(), now=0.0)
    tracker.departed(set(), set(), now=5.0)  # its requests expired: nothing left to drop
    assert tracker.departed({"w1"}, set(), now=TTL_S + 1.0) == []


def test_only_departed_workers_are_returned_in_id_order() -> None:
    tracker = WorkerTracker(TTL_S)
    tracker.departed({"w1", "w2", "w3"}, {"w1", "w2", "w3"}, now=0.0)
    assert tracker.departed({"w1", "w2", "w3"}, {"w2"}, now=1.0) == ["w1", "w3"]
