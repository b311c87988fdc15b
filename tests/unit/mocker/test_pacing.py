"""Pacing (decision 005): a deadline with bounded debt when sleeping; bursts at speedup 0."""

from __future__ import annotations

import pytest

from services.mocker.pacing import (
    FLUSH_EVERY_STEPS,
    FLUSH_INTERVAL_S,
    MAX_TIMING_DEBT_S,
    Pacer,
    StepTimes,
)


def _sleeping(*, now: float = 100.0, emit_after_prefill: bool = False) -> Pacer:
    return Pacer(speedup_ratio=1.0, emit_after_prefill=emit_after_prefill, now=now)


def _bursting(now: float = 100.0) -> Pacer:
    return Pacer(speedup_ratio=0.0, emit_after_prefill=False, now=now)


def test_speedup_zero_never_sleeps() -> None:
    assert _bursting().is_sleeping is False
    assert _sleeping().is_sleeping is True


def test_tokens_go_out_at_the_end_of_a_step() -> None:
    assert _sleeping().step(100.0, 0.02, 0.015) == StepTimes(emit_at=100.02, end_at=None)


def test_steps_chain_on_the_deadline_not_on_when_the_loop_got_there() -> None:
    pacer = _sleeping()
    pacer.step(100.0, 0.02, 0.0)
    # Publishing took 5 ms past the deadline: the next step still starts at the deadline.
    assert pacer.step(100.025, 0.02, 0.0).emit_at == pytest.approx(100.04)


def test_an_early_loop_waits_for_the_deadline() -> None:
    pacer = _sleeping()
    pacer.step(100.0, 0.02, 0.0)
    assert pacer.step(100.001, 0.01, 0.0).emit_at == pytest.approx(100.03)


def test_lag_beyond_the_timing_debt_is_forgiven() -> None:
    pacer = _sleeping()
    pacer.step(100.0, 0.02, 0.0)
    late = 101.0  # a second behind: catch up at most MAX_TIMING_DEBT_S, not a second's burst
    emit_at = pacer.step(late, 0.02, 0.0).emit_at
    assert emit_at == pytest.approx(late - MAX_TIMING_DEBT_S + 0.02)
    assert pacer.step(late, 0.02, 0.0).emit_at == pytest.approx(emit_at + 0.02)


def test_dynamo_step_order_emits_after_the_prefill_then_ends_the_step() -> None:
    pacer = _sleeping(emit_after_prefill=True)
    times = pacer.step(100.0, 0.03, 0.02)
    assert times.emit_at == pytest.approx(100.02)
    assert times.end_at == pytest.approx(100.03)
    assert pacer.step(100.03, 0.01, 0.0).emit_at == pytest.approx(100.03)  # decode-only step


def test_a_burst_flushes_every_few_steps() -> None:
    pacer = _bursting()
    due = [pacer.flush_due(100.0) for _ in range(FLUSH_EVERY_STEPS)]
    assert due == [False] * (FLUSH_EVERY_STEPS - 1) + [True]


def test_a_burst_flushes_after_the_interval_even_with_few_steps() -> None:
    pacer = _bursting()
    assert pacer.flush_due(100.0 + FLUSH_INTERVAL_S / 2) is False
    assert pacer.flush_due(100.0 + FLUSH_INTERVAL_S) is True


def test_a_flush_starts_the_next_burst() -> None:
    pacer = _bursting()
    for _ in range(FLUSH_EVERY_STEPS):
        pacer.flush_due(100.0)
    pacer.flushed(100.002)
    assert pacer.flush_due(100.002 + FLUSH_INTERVAL_S / 2) is False
    due = [pacer.flush_due(100.002) for _ in range(FLUSH_EVERY_STEPS - 1)]
    assert due == [False] * (FLUSH_EVERY_STEPS - 2) + [True]
