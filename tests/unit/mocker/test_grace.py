"""A worker's grace for a formatter whose batches bounce (decision 018): pure decisions."""

from __future__ import annotations

from services.mocker.grace import BOUNCE_WAIT_S, FORMATTER_GRACE_S, FormatterGrace

RID = "r1"


def test_the_first_bounce_starts_one_grace_and_later_ones_none() -> None:
    grace = FormatterGrace()
    assert [grace.bounced(RID, 0, t) for t in (0.0, 0.1, 0.2)] == [True, False, False]
    assert len(grace) == 1


def test_before_the_grace_ends_the_check_says_when_it_does() -> None:
    grace = FormatterGrace()
    grace.bounced(RID, 0, 10.0)
    assert grace.check(RID, 0, 11.0) == 10.0 + FORMATTER_GRACE_S


def test_still_bouncing_when_the_grace_ends_is_gone() -> None:
    grace = FormatterGrace()
    grace.bounced(RID, 0, 0.0)
    grace.sent(RID, 1.0)
    grace.bounced(RID, 0, 1.001)  # that batch bounced too
    assert grace.check(RID, 0, FORMATTER_GRACE_S) == "gone"
    assert RID not in grace


def test_a_batch_that_did_not_bounce_means_the_formatter_is_back() -> None:
    grace = FormatterGrace()
    grace.bounced(RID, 0, 0.0)
    grace.sent(RID, 1.0)
    grace.sent(RID, 2.0)
    assert grace.check(RID, 0, FORMATTER_GRACE_S) == "back"
    assert RID not in grace


def test_a_batch_sent_just_before_the_end_is_waited_for() -> None:
    grace = FormatterGrace()
    grace.bounced(RID, 0, 0.0)
    sent_at = FORMATTER_GRACE_S - 0.1
    grace.sent(RID, sent_at)
    assert grace.check(RID, 0, FORMATTER_GRACE_S) == sent_at + BOUNCE_WAIT_S
    assert grace.check(RID, 0, sent_at + BOUNCE_WAIT_S) == "back"


def test_bounces_that_keep_coming_past_the_wait_are_gone() -> None:
    grace = FormatterGrace()
    grace.bounced(RID, 0, 0.0)
    end = FORMATTER_GRACE_S + BOUNCE_WAIT_S
    grace.bounced(RID, 0, end - 0.01)
    grace.sent(RID, end)
    assert grace.check(RID, 0, end) == "gone"


def test_a_request_no_longer_held_is_dropped() -> None:
    grace = FormatterGrace()
    grace.bounced(RID, 0, 0.0)
    assert grace.check(RID, None, FORMATTER_GRACE_S) == "dropped"
    assert RID not in grace


def test_another_attempt_held_drops_the_grace_of_the_old_one() -> None:
    grace = FormatterGrace()
    grace.bounced(RID, 0, 0.0)
    assert grace.check(RID, 1, 1.0) == "dropped"


def test_a_new_attempt_bouncing_restarts_the_grace_on_the_same_timer() -> None:
    grace = FormatterGrace()
    grace.bounced(RID, 0, 0.0)
    assert grace.bounced(RID, 1, 2.0) is False
    assert grace.check(RID, 1, FORMATTER_GRACE_S) == 2.0 + FORMATTER_GRACE_S


def test_sent_without_a_grace_records_nothing() -> None:
    grace = FormatterGrace()
    grace.sent(RID, 1.0)
    assert len(grace) == 0
    assert grace.check(RID, 0, 5.0) == "dropped"
