"""When the gateway resubmits a request that failed before its client saw anything."""

from __future__ import annotations

import pytest

from services.gateway.core.retry import MAX_DELAY_S, RetryBudget, attempt_id


@pytest.mark.parametrize(
    "code", ["service_unavailable", "shutting_down", "formatter_lost", "no_worker_available"]
)
def test_passing_unavailability_is_retried(code: str) -> None:
    assert RetryBudget(5.0, started_at=0).delay(code, now=0) is not None


@pytest.mark.parametrize(
    "code", ["all_workers_busy", "worker_lost", "timeout", "invalid_request", "internal_error"]
)
def test_overload_timeouts_and_real_failures_are_not(code: str) -> None:
    assert RetryBudget(5.0, started_at=0).delay(code, now=0) is None


def test_delays_double_up_to_a_cap_and_count_attempts() -> None:
    budget = RetryBudget(100.0, started_at=0)
    delays = [budget.delay("shutting_down", now=0) for _ in range(7)]
    assert delays == [0.05, 0.1, 0.2, 0.4, MAX_DELAY_S, MAX_DELAY_S, MAX_DELAY_S]
    assert budget.attempts == 7


def test_no_retry_that_would_end_past_the_budget() -> None:
    budget = RetryBudget(2.0, started_at=10.0)
    assert budget.delay("shutting_down", now=11.97) is None
    assert budget.delay("shutting_down", now=11.0) == 0.05


def test_a_zero_budget_turns_retries_off() -> None:
    assert RetryBudget(0.0, started_at=0).delay("shutting_down", now=0) is None


def test_attempt_ids_are_distinct_subject_tokens() -> None:
    assert [attempt_id("abc", n) for n in (1, 2)] == ["abc-r1", "abc-r2"]
