"""Worker liveness by heartbeat age, where time the bucket could not be watched is excused."""

from __future__ import annotations

from shared.messages import WorkerCard
from shared.registry.reader import MAX_BLIND_SPANS, LiveWorkers

TTL_S = 10.0


def _view(*heartbeats: float) -> LiveWorkers:
    view = LiveWorkers(ttl_s=TTL_S)
    for i, at in enumerate(heartbeats):
        view.put(WorkerCard(worker_id=f"w{i}", model="m", heartbeat_at=at))
    return view


def _live(view: LiveWorkers, now: float) -> list[str]:
    return [c.worker_id for c in view.for_model("m", now)]


def test_a_card_older_than_the_ttl_is_not_live() -> None:
    view = _view(0.0)
    assert (_live(view, 9.9), _live(view, 10.0)) == (["w0"], [])


def test_while_blind_no_card_ages() -> None:
    view = _view(0.0)
    view.go_blind(5.0)
    assert _live(view, 60.0) == ["w0"]
    assert view.models(60.0) == {"m"}


def test_after_a_blind_span_a_card_keeps_the_ttl_it_had_left() -> None:
    view = _view(0.0)
    view.go_blind(5.0)
    view.see(30.0)
    assert (_live(view, 34.9), _live(view, 35.0)) == (["w0"], [])


def test_a_heartbeat_after_the_blind_span_is_judged_as_usual() -> None:
    view = _view(0.0)
    view.go_blind(5.0)
    view.see(30.0)
    view.put(WorkerCard(worker_id="w0", model="m", heartbeat_at=31.0))
    assert (_live(view, 40.9), _live(view, 41.0)) == (["w0"], [])


def test_going_blind_and_seeing_again_report_only_changes() -> None:
    view = _view()
    assert [view.go_blind(1.0), view.go_blind(2.0), view.see(3.0), view.see(4.0)] == [
        True,
        False,
        True,
        False,
    ]
    assert view.blind == [(1.0, 3.0)]


def test_only_the_latest_blind_spans_are_kept() -> None:
    view = _view()
    for t in range(20):
        view.go_blind(float(t))
        view.see(t + 0.5)
    assert view.blind == [(t, t + 0.5) for t in range(20 - MAX_BLIND_SPANS, 20)]


def test_the_list_is_kept_between_calls_and_a_heartbeat_updates_it_in_place() -> None:
    view = _view(0.0, 1.0)
    first = view.for_model("m", 2.0)
    assert view.for_model("m", 3.0) is first
    view.put(WorkerCard(worker_id="w0", model="m", heartbeat_at=4.0))
    assert view.for_model("m", 5.0) is first
    assert first[0].heartbeat_at == 4.0


def test_the_list_is_rebuilt_when_a_worker_comes_leaves_or_expires() -> None:
    view = _view(0.0, 1.0)
    first = view.for_model("m", 2.0)
    view.put(WorkerCard(worker_id="w2", model="m", heartbeat_at=2.0))
    second = view.for_model("m", 2.0)
    assert second is not first
    assert _live(view, 2.0) == ["w0", "w1", "w2"]
    view.remove("w1")
    assert _live(view, 2.0) == ["w0", "w2"]
    assert _live(view, 10.0) == ["w2"]  # w0's beat at 0 is 10 s old: expired, not cached
    view.put(WorkerCard(worker_id="w2", model="m", heartbeat_at=2.0, block_size=32))
    assert view.for_model("m", 10.0)[0].block_size == 32  # not a heartbeat: rebuilt


def test_an_expired_card_that_beats_again_is_listed_again() -> None:
    view = _view(0.0)
    assert _live(view, 11.0) == []
    view.put(WorkerCard(worker_id="w0", model="m", heartbeat_at=11.0))
    assert _live(view, 11.5) == ["w0"]


def test_other_models_are_not_listed_and_blindness_rebuilds() -> None:
    view = _view(0.0)
    view.put(WorkerCard(worker_id="x", model="other", heartbeat_at=0.0))
    first = view.for_model("m", 1.0)
    view.go_blind(2.0)
    assert view.for_model("m", 30.0) is not first
    assert _live(view, 30.0) == ["w0"]
