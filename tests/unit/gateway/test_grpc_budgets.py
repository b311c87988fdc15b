"""Flood budgets of an HTTP/2 connection (``grpcserver/budgets.py``): token buckets, pure."""

from __future__ import annotations

from services.gateway.grpc.http2.budgets import RATES, Budgets, Flood, Rate


def test_a_burst_is_allowed_then_one_more_is_refused() -> None:
    budgets = Budgets(0.0, {Flood.PING: Rate(3, 1)})
    assert [budgets.take(Flood.PING, 0.0) for _ in range(4)] == [True, True, True, False]


def test_the_budget_refills_at_its_rate_up_to_the_burst() -> None:
    budgets = Budgets(0.0, {Flood.PING: Rate(3, 2)})
    for _ in range(3):
        budgets.take(Flood.PING, 0.0)
    assert not budgets.take(Flood.PING, 0.0)
    assert budgets.take(Flood.PING, 0.5)  # one frame's worth came back
    assert not budgets.take(Flood.PING, 0.5)
    assert [budgets.take(Flood.PING, 100.0) for _ in range(4)] == [True, True, True, False]


def test_kinds_are_counted_apart() -> None:
    budgets = Budgets(0.0, {Flood.PING: Rate(1, 0), Flood.SETTINGS: Rate(1, 0)})
    assert budgets.take(Flood.PING, 0.0)
    assert not budgets.take(Flood.PING, 0.0)
    assert budgets.take(Flood.SETTINGS, 0.0)


def test_refusals_do_not_count_against_the_refill() -> None:
    """A client that keeps sending past the budget is refused until it slows down, no longer."""
    budgets = Budgets(0.0, {Flood.RESET: Rate(1, 1)})
    budgets.take(Flood.RESET, 0.0)
    assert not any(budgets.take(Flood.RESET, 0.1 * i) for i in range(1, 10))
    assert budgets.take(Flood.RESET, 1.0)


def test_every_kind_has_a_rate_that_rapid_reset_cannot_outrun() -> None:
    assert set(RATES) == set(Flood)
    assert RATES[Flood.RESET] == Rate(1000, 33)  # nghttp2's defaults


def test_answers_earn_the_frames_a_client_sends_because_it_is_answered() -> None:
    """WINDOW_UPDATE and PING follow the server's output; other kinds earn nothing."""
    rates = {
        Flood.WINDOW_UPDATE: Rate(4, 0, per_response=2),
        Flood.SETTINGS: Rate(1, 0),
    }
    budgets = Budgets(0.0, rates)
    assert all(budgets.take(Flood.WINDOW_UPDATE, 0.0) for _ in range(4))
    assert not budgets.take(Flood.WINDOW_UPDATE, 0.0)
    budgets.credit(1)
    assert [budgets.take(Flood.WINDOW_UPDATE, 0.0) for _ in range(3)] == [True, True, False]
    budgets.credit(100)  # never above the burst
    assert sum(budgets.take(Flood.WINDOW_UPDATE, 0.0) for _ in range(10)) == 4
    budgets.take(Flood.SETTINGS, 0.0)
    budgets.credit(100)
    assert not budgets.take(Flood.SETTINGS, 0.0)
