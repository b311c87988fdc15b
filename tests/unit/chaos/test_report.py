"""The chaos suite's pure summary: counts, failure keys, recovery times and target checks."""

from __future__ import annotations

import pytest

from tests.chaos.report import (
    Counted,
    Goal,
    RequestRecord,
    Target,
    broken_rules,
    counter_increase,
    counter_samples,
    has_counter,
    is_met,
    missed_times,
    summarize,
)

FAULT = 10.0


def ok(start: float, end: float, first: float | None = None) -> RequestRecord:
    return RequestRecord(start_s=start, end_s=end, ok=True, first_token_s=first)


def failed(
    start: float,
    end: float,
    *,
    status: int | None = None,
    code: str | None = None,
    error_class: str | None = None,
) -> RequestRecord:
    return RequestRecord(
        start_s=start, end_s=end, ok=False, status=status, code=code, error_class=error_class
    )


class TestFailureKeys:
    def test_an_http_error_is_status_and_code(self) -> None:
        assert failed(0, 1, status=503, code="no_worker_available").failure == (
            "503 no_worker_available"
        )

    def test_an_in_band_error_event_is_sse_and_code(self) -> None:
        assert failed(0, 1, code="timeout", error_class="APIError").failure == "sse timeout"

    def test_a_client_side_failure_is_its_class(self) -> None:
        assert failed(0, 1, error_class="connection_error").failure == "connection_error"

    def test_a_completed_request_has_no_failure(self) -> None:
        assert ok(0, 1).failure is None

    def test_only_a_stack_code_other_than_the_catch_all_is_typed(self) -> None:
        assert failed(0, 1, status=504, code="timeout").is_typed_failure
        assert not failed(0, 1, status=500, code="internal_error").is_typed_failure
        assert not failed(0, 1, error_class="client_timeout").is_typed_failure


class TestSummarize:
    def test_counts_sent_completed_and_failures_by_key(self) -> None:
        records = [
            ok(1, 2),
            failed(9, 11, status=503, code="service_unavailable"),
            failed(11, 11.1, status=503, code="service_unavailable"),
            failed(12, 12.5, error_class="connection_error"),
            ok(12, 13, first=12.4),
        ]
        summary = summarize(records, FAULT, deadline_s=15)
        assert (summary.sent, summary.completed) == (5, 2)
        assert summary.failed == {"503 service_unavailable": 2, "connection_error": 1}
        assert summary.max_latency_s == 2.0

    def test_recovery_is_until_the_first_token_of_a_request_started_after_the_fault(self) -> None:
        records = [ok(9, 10.5, first=9.1), ok(10.2, 12, first=11.5), ok(10.1, 13, first=12.0)]
        assert summarize(records, FAULT, deadline_s=15).recover_s == 1.5

    def test_recovery_without_a_token_is_until_the_request_ended(self) -> None:
        assert summarize([ok(10.5, 11.25)], FAULT, deadline_s=15).recover_s == 1.25

    def test_no_recovery_when_nothing_started_after_the_fault_completed(self) -> None:
        records = [ok(9, 11), failed(10.5, 11, error_class="connection_error")]
        assert summarize(records, FAULT, deadline_s=15).recover_s is None

    def test_steady_is_after_the_last_failure_started_after_the_fault(self) -> None:
        records = [
            ok(10.1, 11, first=10.4),
            failed(12, 12.1, status=503, code="no_worker_available"),
            ok(12.5, 14, first=13.0),
        ]
        summary = summarize(records, FAULT, deadline_s=15)
        assert (summary.recover_s, summary.steady_s) == (0.4, 3.0)

    def test_failures_in_flight_at_the_fault_are_told_apart(self) -> None:
        records = [failed(9, 10.5, code="x"), failed(10.5, 11, code="x"), failed(8, 9, code="x")]
        assert summarize(records, FAULT, deadline_s=15).failed_in_flight == 1

    def test_requests_over_the_deadline_are_counted(self) -> None:
        assert summarize([ok(0, 16)], FAULT, deadline_s=15).over_deadline == 1

    def test_serving_again_is_measured_from_when_the_process_was_back(self) -> None:
        records = [ok(10.5, 20, first=18.0), ok(11, 12, first=11.2)]
        summary = summarize(records, FAULT, deadline_s=30, back_at=17.0)
        assert summary.serving_again_s == 1.0

    def test_counting_only_requests_started_before_the_fault(self) -> None:
        records = [ok(9, 11), failed(10.5, 10.6, error_class="connection_error")]
        summary = summarize(records, FAULT, deadline_s=15, counted=Counted.STARTED_BEFORE_FAULT)
        assert (summary.sent, summary.failed) == (1, {})


class TestTargets:
    zero = Target(Goal.ZERO_FAILED, "0 failed")
    in_flight = Target(Goal.IN_FLIGHT_ONLY, "in flight only", recover_within_s=3.0)
    typed = Target(Goal.TYPED_WITHIN_DEADLINE, "typed", recover_within_s=5.0)

    def test_zero_failed_is_met_by_a_clean_run(self) -> None:
        assert is_met(self.zero, summarize([ok(9, 11), ok(10.5, 11)], FAULT, deadline_s=15))

    def test_zero_failed_is_not_met_by_one_failure(self) -> None:
        records = [ok(10.5, 11), failed(11, 12, status=503, code="no_worker_available")]
        assert not is_met(self.zero, summarize(records, FAULT, deadline_s=15))

    def test_zero_failed_needs_requests_served_after_the_fault(self) -> None:
        assert not is_met(self.zero, summarize([ok(9, 9.5)], FAULT, deadline_s=15))

    def test_in_flight_only_allows_failures_of_requests_the_fault_caught(self) -> None:
        records = [failed(9, 10.2, code="service_unavailable"), ok(10.3, 11, first=10.5)]
        assert is_met(self.in_flight, summarize(records, FAULT, deadline_s=15))

    def test_in_flight_only_refuses_a_failure_started_after_the_fault(self) -> None:
        records = [failed(10.1, 10.2, status=503, code="x"), ok(10.3, 11, first=10.5)]
        assert not is_met(self.in_flight, summarize(records, FAULT, deadline_s=15))

    def test_in_flight_only_refuses_a_slow_recovery(self) -> None:
        assert not is_met(
            self.in_flight, summarize([ok(10.1, 14, first=13.5)], FAULT, deadline_s=15)
        )

    def test_typed_allows_typed_failures_and_needs_serving_soon_after_back(self) -> None:
        records = [failed(9, 14, status=504, code="timeout"), ok(15, 17, first=16.0)]
        assert is_met(self.typed, summarize(records, FAULT, deadline_s=15, back_at=12.0))

    def test_typed_refuses_an_untyped_failure(self) -> None:
        records = [failed(9, 14, error_class="incomplete_stream"), ok(15, 17, first=16.0)]
        assert not is_met(self.typed, summarize(records, FAULT, deadline_s=15, back_at=12.0))

    def test_typed_refuses_serving_late_after_back(self) -> None:
        records = [ok(10.5, 20, first=18.0)]
        assert not is_met(self.typed, summarize(records, FAULT, deadline_s=30, back_at=12.0))


class TestRulesAndTimes:
    """Tests assert the rules (``broken_rules``); the benchmark reports ``missed_times``."""

    inside = Target(Goal.AWAITING_FIRST_TOKEN_ONLY, "inside only", recover_within_s=3.0)
    in_flight = Target(Goal.IN_FLIGHT_ONLY, "in flight only", recover_within_s=3.0)
    typed = Target(Goal.TYPED_WITHIN_DEADLINE, "typed", recover_within_s=5.0)

    def test_a_slow_recovery_breaks_no_rule_and_misses_the_bound(self) -> None:
        # issue 23: 301 of 301 completed on a busy machine, first served 3.25 s after the fault
        summary = summarize(
            [ok(9, 10.5, first=9.2), ok(10.1, 13.5, first=13.25)], FAULT, deadline_s=20
        )
        assert broken_rules(self.inside, summary) == []
        assert missed_times(self.inside, summary) == ["recovery 3.25 s, not < 3 s"]
        assert not is_met(self.inside, summary)

    def test_a_failure_after_the_fault_breaks_a_rule(self) -> None:
        records = [failed(10.1, 10.2, status=503, code="no_worker_available"), ok(10.3, 11)]
        summary = summarize(records, FAULT, deadline_s=20)
        assert broken_rules(self.inside, summary) == [
            "1 failed that were not awaiting a first token"
        ]

    def test_an_untyped_failure_in_flight_breaks_a_rule(self) -> None:
        records = [failed(9, 10.5, error_class="incomplete_stream"), ok(10.3, 11, first=10.5)]
        summary = summarize(records, FAULT, deadline_s=20)
        assert broken_rules(self.in_flight, summary) == ["1 failed without a typed error"]

    def test_nothing_served_after_the_fault_breaks_a_rule(self) -> None:
        summary = summarize([ok(9, 9.5)], FAULT, deadline_s=20)
        assert broken_rules(self.in_flight, summary) == [
            "nothing started after the fault was served"
        ]

    def test_a_request_over_the_deadline_is_a_missed_time_not_a_broken_rule(self) -> None:
        summary = summarize([ok(10.5, 31, first=13.0)], FAULT, deadline_s=20, back_at=12.0)
        assert broken_rules(self.typed, summary) == []
        assert missed_times(self.typed, summary) == ["1 took longer than the deadline"]

    def test_serving_late_after_back_is_a_missed_time(self) -> None:
        summary = summarize([ok(10.5, 20, first=18.0)], FAULT, deadline_s=30, back_at=12.0)
        assert broken_rules(self.typed, summary) == []
        assert missed_times(self.typed, summary) == ["serving again 6.00 s, not < 5 s"]


class TestCounters:
    TEXT = (
        "# HELP jetserve_migrations_total Requests migrated\n"
        "# TYPE jetserve_migrations_total counter\n"
        'jetserve_migrations_total{service="formatter"} 3.0\n'
        'jetserve_migrations_created{service="formatter"} 1.7e9\n'
        "jetserve_in_flight 2.0\n"
    )

    def test_samples_are_found_by_name_suffix_with_their_labels(self) -> None:
        found = counter_samples(self.TEXT, "migrations_total")
        assert found == {'jetserve_migrations_total{service="formatter"}': 3.0}

    def test_no_such_metric_is_empty(self) -> None:
        assert counter_samples(self.TEXT, "bounces_total") == {}

    @pytest.mark.parametrize(
        ("values", "expected"),
        [([0, 2, 5], 5), ([1, 4, 0, 2], 6), ([], 0), ([3, 3], 3)],
    )
    def test_increase_counts_a_restart_from_zero_in_full(
        self, values: list[float], expected: float
    ) -> None:
        assert counter_increase(values) == expected


class TestInsideTheProcess:
    """A preprocessor or router holds a request only until it reaches a worker."""

    inside = Target(Goal.AWAITING_FIRST_TOKEN_ONLY, "inside only", recover_within_s=3.0)

    def test_a_request_without_a_token_at_the_fault_may_fail(self) -> None:
        records = [failed(9.5, 16, status=504, code="timeout"), ok(10.2, 11, first=10.5)]
        summary = summarize(records, FAULT, deadline_s=15)
        assert summary.failed_awaiting_first_token == 1
        assert is_met(self.inside, summary)

    def test_a_stream_that_already_had_tokens_may_not(self) -> None:
        streaming = RequestRecord(
            start_s=9, end_s=11, ok=False, first_token_s=9.5, code="worker_lost"
        )
        summary = summarize([streaming, ok(10.2, 11, first=10.5)], FAULT, deadline_s=15)
        assert (summary.failed_in_flight, summary.failed_awaiting_first_token) == (1, 0)
        assert not is_met(self.inside, summary)


class TestCounterDeclared:
    def test_a_labelled_counter_without_samples_is_declared(self) -> None:
        text = "# HELP jetserve_formatter_migrations_total x\n"
        text += "# TYPE jetserve_formatter_migrations_total counter\n"
        assert has_counter(text, "migrations_total")

    def test_another_counter_is_not(self) -> None:
        assert not has_counter("# TYPE jetserve_in_flight gauge\n", "migrations_total")
