"""Streams: the open/early-event state machine of one formatter (every transition and bound)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.formatter.streams import (
    DONE_TTL_S,
    HELD,
    MAX_AGE_S,
    OPENED,
    Dropped,
    Held,
    Ignore,
    Replay,
    Streams,
)
from shared.messages import RequestFailed, TokenBatch, WorkerEvent


@dataclass
class State:
    """Stands in for a RequestFormatter: the table only reads ``last_seen``."""

    name: str
    last_seen: float = 0.0


def batch(request_id: str, index: int = 0) -> TokenBatch:
    return TokenBatch(request_id=request_id, token_ids=(index,), index=index)


def table(**bounds: float) -> Streams[State]:
    return Streams(idle_timeout_s=bounds.pop("idle_timeout_s", 60.0), **bounds)  # type: ignore[arg-type]


def hold(streams: Streams[State], *events: WorkerEvent, now: float = 0.0) -> None:
    for event in events:
        assert isinstance(streams.on_event(event, now), Held)


# --- unknown → held → replaying → open ---------------------------------------------------------


def test_an_unknown_request_s_event_is_held() -> None:
    streams = table()
    assert streams.on_event(batch("r1"), 0.0) is HELD
    assert (streams.phase("r1"), streams.waiting, streams.in_flight) == ("held", 1, 0)
    assert streams.get("r1") is None


def test_an_open_with_nothing_held_is_open_at_once() -> None:
    streams = table()
    state = State("r1")
    assert streams.on_open("r1", state) is OPENED
    assert (streams.phase("r1"), streams.in_flight, streams.waiting) == ("open", 1, 0)
    assert streams.on_event(batch("r1"), 0.0) is state
    assert streams.get("r1") is state


def test_held_events_are_replayed_in_order_then_the_request_is_open() -> None:
    streams = table()
    first, second = batch("r1", 0), batch("r1", 1)
    failed = RequestFailed(request_id="r1", code="x", message="y")
    hold(streams, first, second, failed)
    state = State("r1")
    assert streams.on_open("r1", state) == Replay((first, second, failed))
    assert streams.phase("r1") == "replaying"
    assert streams.get("r1") is state  # a failure during the replay knows where to go
    assert streams.in_flight == 0
    assert streams.replayed("r1") == ()
    assert (streams.phase("r1"), streams.in_flight, streams.waiting) == ("open", 1, 0)


def test_events_that_come_during_the_replay_are_held_and_replayed_next() -> None:
    streams = table()
    hold(streams, batch("r1", 0))
    state = State("r1")
    assert streams.on_open("r1", state) == Replay((batch("r1", 0),))
    # Not delivered to the state yet: it would overtake the replay.
    assert streams.on_event(batch("r1", 1), 0.1) is HELD
    assert streams.on_event(batch("r1", 2), 0.1) is HELD
    assert streams.replayed("r1") == (batch("r1", 1), batch("r1", 2))
    assert streams.phase("r1") == "replaying"
    assert streams.replayed("r1") == ()
    assert streams.on_event(batch("r1", 3), 0.2) is state


def test_requests_are_kept_apart() -> None:
    streams = table()
    hold(streams, batch("r1"), batch("r2"))
    assert streams.on_open("r2", State("r2")) == Replay((batch("r2"),))
    assert streams.phase("r1") == "held"


# --- loading ------------------------------------------------------------------------------------


def test_a_loading_open_keeps_its_events_past_the_age_limit() -> None:
    streams = table(max_age_s=2.0)
    hold(streams, batch("loading"), batch("other"), now=0.0)
    streams.loading("loading", 0.5)
    assert streams.phase("loading") == "loading"
    assert streams.expire(5.0).early == ["other"]
    assert streams.on_open("loading", State("loading")) == Replay((batch("loading"),))


def test_events_for_a_loading_open_are_held_for_it() -> None:
    streams = table()
    streams.loading("r1", 0.0)
    assert (streams.phase("r1"), streams.waiting) == ("loading", 1)
    assert streams.on_event(batch("r1"), 10.0) is HELD
    assert streams.expire(20.0).early == []
    assert streams.on_open("r1", State("r1")) == Replay((batch("r1"),))


def test_a_loading_open_with_nothing_held_is_open_at_once() -> None:
    streams = table()
    streams.loading("r1", 0.0)
    assert streams.on_open("r1", State("r1")) is OPENED
    assert (streams.phase("r1"), streams.waiting) == ("open", 0)


def test_loading_changes_nothing_for_an_open_or_done_request() -> None:
    streams = table()
    streams.on_open("open", State("open"))
    streams.end("done", 0.0)
    streams.loading("open", 0.0)
    streams.loading("done", 0.0)
    assert (streams.phase("open"), streams.phase("done"), streams.waiting) == ("open", "done", 0)


def test_a_failed_load_ends_the_request_and_drops_its_events() -> None:
    streams = table()
    hold(streams, batch("r1"))
    streams.loading("r1", 0.0)
    assert streams.end("r1", 0.1) is None
    assert (streams.phase("r1"), streams.waiting) == ("done", 0)
    assert streams.on_event(batch("r1", 1), 0.2) == Dropped("finished")


# --- end: finished, failed, cancelled -----------------------------------------------------------


def test_end_returns_the_state_of_an_open_request() -> None:
    streams = table()
    state = State("r1")
    streams.on_open("r1", state)
    assert streams.end("r1", 1.0) is state
    assert (streams.phase("r1"), streams.in_flight) == ("done", 0)
    assert streams.end("r1", 1.0) is None


def test_events_after_the_end_are_dropped_not_held() -> None:
    streams = table()
    streams.on_open("r1", State("r1"))
    streams.end("r1", 1.0)
    assert streams.on_event(batch("r1", 5), 1.1) == Dropped("finished")
    assert streams.waiting == 0


def test_cancel_before_the_open_drops_held_events_and_ignores_the_open() -> None:
    streams = table()
    hold(streams, batch("r1"))
    assert streams.end("r1", 0.1) is None  # the Cancel
    assert streams.waiting == 0
    assert streams.on_open("r1", State("r1")) == Ignore("cancelled")
    assert (streams.phase("r1"), streams.in_flight) == ("done", 0)


def test_cancel_of_an_unknown_request_ignores_its_open() -> None:
    streams = table()
    streams.end("r1", 0.0)
    assert streams.on_open("r1", State("r1")) == Ignore("cancelled")


def test_cancel_during_the_replay_never_opens_the_request() -> None:
    streams = table()
    hold(streams, batch("r1"))
    state = State("r1")
    streams.on_open("r1", state)
    assert streams.end("r1", 0.1) is state
    assert streams.replayed("r1") == ()
    assert (streams.phase("r1"), streams.in_flight) == ("done", 0)


def test_done_ids_are_forgotten_after_their_ttl() -> None:
    streams = table()
    streams.end("old", 0.0)
    streams.end("new", DONE_TTL_S + 1)  # pruning happens as ids are added
    assert (streams.phase("old"), streams.phase("new")) == ("unknown", "done")
    assert streams.on_event(batch("old"), DONE_TTL_S + 1) is HELD


def test_a_second_open_is_ignored() -> None:
    streams = table()
    first = State("first")
    streams.on_open("r1", first)
    assert streams.on_open("r1", State("second")) == Ignore("duplicate")
    assert streams.get("r1") is first
    hold(streams, batch("r2"))
    streams.on_open("r2", State("r2"))
    assert streams.on_open("r2", State("again")) == Ignore("duplicate")


# --- expiry -------------------------------------------------------------------------------------


def test_old_held_requests_age_out_young_ones_stay() -> None:
    streams = table(max_age_s=2.0)
    hold(streams, batch("old"), now=0.0)
    hold(streams, batch("young"), now=1.5)
    assert streams.expire(2.5).early == ["old"]
    assert streams.expire(2.5).early == []
    assert (streams.phase("old"), streams.phase("young")) == ("unknown", "held")


def test_age_counts_from_the_first_event() -> None:
    streams = table(max_age_s=2.0)
    hold(streams, batch("r1", 0), now=0.0)
    hold(streams, batch("r1", 1), now=1.9)
    assert streams.expire(2.1).early == ["r1"]


def test_the_default_age_limit() -> None:
    streams = table()
    hold(streams, batch("r1"), now=0.0)
    assert streams.expire(MAX_AGE_S).early == []
    assert streams.expire(MAX_AGE_S + 0.01).early == ["r1"]


def test_a_replaying_request_does_not_age_out() -> None:
    streams = table(max_age_s=2.0)
    hold(streams, batch("r1"), now=0.0)
    streams.on_open("r1", State("r1"))
    assert streams.expire(10.0).early == []
    assert streams.phase("r1") == "replaying"


def test_idle_open_requests_end_and_are_returned_to_fail() -> None:
    streams = table(idle_timeout_s=5.0)
    idle, busy = State("idle", last_seen=0.0), State("busy", last_seen=4.0)
    streams.on_open("idle", idle)
    streams.on_open("busy", busy)
    expired = streams.expire(6.0)
    assert expired.idle == [("idle", idle)]
    assert (streams.phase("idle"), streams.phase("busy"), streams.in_flight) == ("done", "open", 1)
    assert streams.on_event(batch("idle"), 6.1) == Dropped("finished")


def test_open_requests_lists_a_snapshot() -> None:
    streams = table()
    a, b = State("a"), State("b")
    streams.on_open("a", a)
    streams.on_open("b", b)
    for request_id, _ in streams.open_requests():
        streams.end(request_id, 0.0)
    assert streams.in_flight == 0


# --- bounds -------------------------------------------------------------------------------------


def test_too_many_held_requests_evicts_the_oldest() -> None:
    streams = table(max_requests=2)
    hold(streams, batch("a"), batch("b"))
    assert streams.on_event(batch("a", 1), 0.0) is HELD  # known request: no eviction
    assert streams.on_event(batch("c"), 0.0) == Held(evicted="a")
    assert (streams.phase("a"), streams.waiting) == ("unknown", 2)


def test_eviction_spares_requests_whose_open_is_under_way() -> None:
    streams = table(max_requests=3)
    hold(streams, batch("loading"), batch("replaying"), batch("held"))
    streams.loading("loading", 0.0)
    streams.on_open("replaying", State("replaying"))
    assert streams.on_event(batch("new"), 0.0) == Held(evicted="held")
    assert streams.on_event(batch("newer"), 0.0) == Held(evicted="new")
    assert (streams.phase("loading"), streams.phase("replaying")) == ("loading", "replaying")


def test_no_room_when_every_waiting_request_is_opening() -> None:
    streams = table(max_requests=1)
    streams.loading("loading", 0.0)
    assert streams.on_event(batch("new"), 0.0) == Dropped("too_many_requests")
    assert streams.phase("new") == "unknown"


def test_events_per_request_are_bounded() -> None:
    streams = table(max_events=3)
    outcomes = [streams.on_event(batch("r1", i), 0.0) for i in range(5)]
    assert outcomes == [HELD, HELD, HELD, Dropped("too_many_events"), Dropped("too_many_events")]
    replay = streams.on_open("r1", State("r1"))
    assert isinstance(replay, Replay)
    assert [e.index for e in replay.events if isinstance(e, TokenBatch)] == [0, 1, 2]


@pytest.mark.parametrize("phase", ["held", "loading"])
def test_the_bound_holds_while_waiting(phase: str) -> None:
    streams = table(max_events=2)
    if phase == "loading":
        streams.loading("r1", 0.0)
    for i in range(4):
        streams.on_event(batch("r1", i), 0.0)
    replay = streams.on_open("r1", State("r1"))
    assert isinstance(replay, Replay)
    assert len(replay.events) == 2
