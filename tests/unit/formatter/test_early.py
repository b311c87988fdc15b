"""EarlyEvents: events held for a request whose StreamOpen has not arrived yet."""

from __future__ import annotations

from services.formatter.early import EarlyEvents
from shared import codec
from shared.messages import RequestFailed, TokenBatch, WorkerEvent


def batch(request_id: str, index: int = 0) -> tuple[WorkerEvent, bytes]:
    event = TokenBatch(request_id=request_id, token_ids=(1,), index=index)
    return event, codec.encode(event)


def test_held_events_come_back_in_order_once() -> None:
    early = EarlyEvents()
    first, second = batch("r1", 0), batch("r1", 1)
    failed = RequestFailed(request_id="r1", code="x", message="y")
    early.hold(*first, now=0.0)
    early.hold(*second, now=0.1)
    early.hold(failed, codec.encode(failed), now=0.2)
    assert early.take("r1") == [first, second, (failed, codec.encode(failed))]
    assert early.take("r1") == []
    assert len(early) == 0


def test_requests_are_kept_apart() -> None:
    early = EarlyEvents()
    early.hold(*batch("r1"), now=0.0)
    early.hold(*batch("r2"), now=0.0)
    assert [e.request_id for e, _ in early.take("r2")] == ["r2"]
    assert len(early) == 1


def test_old_requests_age_out_young_ones_stay() -> None:
    early = EarlyEvents(max_age_s=2.0)
    early.hold(*batch("old"), now=0.0)
    early.hold(*batch("young"), now=1.5)
    assert early.expire(2.5) == ["old"]
    assert early.expire(2.5) == []
    assert len(early.take("young")) == 1


def test_age_counts_from_the_first_event() -> None:
    early = EarlyEvents(max_age_s=2.0)
    early.hold(*batch("r1", 0), now=0.0)
    early.hold(*batch("r1", 1), now=1.9)
    assert early.expire(2.1) == ["r1"]


def test_opens_in_progress_are_not_aged_out() -> None:
    early = EarlyEvents(max_age_s=2.0)
    early.hold(*batch("loading"), now=0.0)
    early.hold(*batch("other"), now=0.0)
    assert early.expire(5.0, keep={"loading"}) == ["other"]
    assert len(early.take("loading")) == 1


def test_too_many_requests_evicts_the_oldest() -> None:
    early = EarlyEvents(max_requests=2)
    assert early.hold(*batch("a"), now=0.0) is None
    assert early.hold(*batch("b"), now=0.0) is None
    assert early.hold(*batch("a", 1), now=0.0) is None  # known request: no eviction
    assert early.hold(*batch("c"), now=0.0) == "a"
    assert (early.take("a"), len(early)) == ([], 2)


def test_events_per_request_are_bounded() -> None:
    early = EarlyEvents(max_events=3)
    for i in range(5):
        early.hold(*batch("r1", i), now=0.0)
    assert [e.index for e, _ in early.take("r1")] == [0, 1, 2]  # type: ignore[union-attr]


def test_discard_forgets_and_counts() -> None:
    early = EarlyEvents()
    early.hold(*batch("r1", 0), now=0.0)
    early.hold(*batch("r1", 1), now=0.0)
    assert (early.discard("r1"), early.discard("r1")) == (2, 0)
