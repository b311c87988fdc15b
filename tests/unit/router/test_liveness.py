"""Which workers a router probes, and when a silent or vanished one counts as lost."""

from __future__ import annotations

from services.router.liveness import FORGET_LOST_S, Liveness
from shared.messages import WorkerCard


def _card(worker_id: str, heartbeat_at: float) -> WorkerCard:
    return WorkerCard(worker_id=worker_id, model="m", heartbeat_at=heartbeat_at)


def test_a_worker_is_probed_again_only_after_its_probe_ended() -> None:
    live = Liveness(unresponsive_s=5)
    assert live.due(["a", "b"], now=0) == ["a", "b"]
    assert live.due(["a", "b"], now=1) == []
    live.answered("a")
    live.dropped("b")
    assert live.due(["a", "b"], now=2) == ["a", "b"]


def test_silence_counts_from_the_first_unanswered_probe() -> None:
    live = Liveness(unresponsive_s=5)
    live.due(["a"], now=10)
    assert not live.timed_out("a", now=11)
    live.due(["a"], now=11.5)
    assert not live.timed_out("a", now=14.9)
    live.due(["a"], now=15)
    assert live.timed_out("a", now=15.1)


def test_an_answer_ends_the_silence() -> None:
    live = Liveness(unresponsive_s=5)
    live.due(["a"], now=0)
    live.timed_out("a", now=1)
    live.due(["a"], now=1)
    live.answered("a")
    live.due(["a"], now=5)
    assert not live.timed_out("a", now=6)


def test_a_lost_worker_that_answers_a_probe_again_is_back() -> None:
    """On a NATS cluster "no responders" may only mean the worker is moving to another node."""
    live = Liveness(unresponsive_s=5)
    live.lose("a", now=0)
    assert live.lost_due(["a", "b"], now=0.25) == ["a"]  # b is not lost: not probed here
    assert live.lost_due(["a"], now=0.5) == []  # its probe is still out
    assert not live.lose("a", now=0.6)  # unanswered again (no responders): still lost, once
    assert live.lost_due(["a"], now=0.75) == ["a"]
    assert live.answered("a")
    assert not live.is_lost(_card("a", heartbeat_at=-1))
    assert not live.answered("a")  # only the first answer brings it back
    assert live.due(["a"], now=1) == ["a"]


def test_a_lost_worker_is_not_probed_and_is_lost_once() -> None:
    live = Liveness(unresponsive_s=5)
    assert live.lose("a", now=3)
    assert not live.lose("a", now=4)
    assert live.due(["a", "b"], now=5) == ["b"]


def test_a_lost_worker_is_left_out_until_it_heartbeats_again() -> None:
    live = Liveness(unresponsive_s=5)
    live.lose("a", now=100)
    assert live.is_lost(_card("a", heartbeat_at=99))
    assert live.revive([_card("a", heartbeat_at=99)], now=101) == []
    assert live.revive([_card("a", heartbeat_at=102)], now=102) == ["a"]
    assert not live.is_lost(_card("a", heartbeat_at=99))


def test_old_losses_are_forgotten() -> None:
    live = Liveness(unresponsive_s=5)
    live.lose("a", now=0)
    live.revive([], now=FORGET_LOST_S + 1)
    assert live.lost == set()
