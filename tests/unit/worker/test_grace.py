"""The worker's grace for a formatter whose batches bounce (decision 018): one per request,
ended by the clock or forgotten on a cancel."""

from __future__ import annotations

from shared.worker.grace import FormatterGrace, Grace

RID = "r1"
GRACE_S = 3.0
"""A grace longer than the default, so the times below read easily."""


def _bounce(grace: FormatterGrace, now: float, attempt: int = 0) -> bool:
    return grace.bounced(RID, attempt, now, formatter_id="f1", gateway="gw.r1")


def test_one_grace_per_request_however_many_batches_bounce() -> None:
    grace = FormatterGrace(GRACE_S)
    assert [_bounce(grace, t) for t in (0.0, 0.1, 0.2)] == [True, False, False]
    assert len(grace) == 1
    assert RID in grace


def test_before_the_grace_ends_it_says_when_it_does() -> None:
    grace = FormatterGrace(GRACE_S)
    _bounce(grace, 10.0)
    assert grace.due(RID, 11.0) == 10.0 + GRACE_S
    assert RID in grace


def test_an_ended_grace_is_handed_over_once_with_what_the_verdict_needs() -> None:
    grace = FormatterGrace(GRACE_S)
    _bounce(grace, 0.0, attempt=2)
    ended = grace.due(RID, GRACE_S)
    assert ended == Grace(RID, 2, GRACE_S, "f1", "gw.r1")
    assert grace.due(RID, GRACE_S + 1) is None
    assert len(grace) == 0


def test_a_cancel_during_the_grace_forgets_it() -> None:
    grace = FormatterGrace(GRACE_S)
    _bounce(grace, 0.0)
    grace.forget(RID)
    assert grace.due(RID, GRACE_S) is None
    grace.forget(RID)  # again, or for a request with no grace: nothing happens


def test_a_bounce_after_the_grace_ended_starts_a_new_one() -> None:
    grace = FormatterGrace(GRACE_S)
    _bounce(grace, 0.0)
    grace.due(RID, GRACE_S)
    assert _bounce(grace, GRACE_S + 0.5)


def test_clear_forgets_every_grace() -> None:
    grace = FormatterGrace(GRACE_S)
    _bounce(grace, 0.0)
    grace.clear()
    assert len(grace) == 0
