"""The engine health verdicts (``shared.worker.health``, decision 029): canary, watchdog,
recovery, and the payload setting."""

from __future__ import annotations

import pytest

from shared.worker.health import (
    DEFAULT_PAYLOAD,
    Action,
    EngineHealth,
    HealthSettings,
    check_payload,
    parse_payload,
)

SETTINGS = HealthSettings(idle_s=10.0, timeout_s=3.0, stall_s=30.0)
STEP_S = 0.25
"""The tests look as the watch does: every tick (``SETTINGS.tick_s`` is 0.75 s)."""


def _health(settings: HealthSettings = SETTINGS) -> EngineHealth:
    return EngineHealth(settings, now=0.0)


def _first(
    health: EngineHealth, start: float, end: float, *, busy: bool, progress: int = 0
) -> tuple[float, Action] | None:
    """Look every ``STEP_S`` from ``start`` to ``end``: the first action and when it came."""
    for i in range(round((end - start) / STEP_S) + 1):
        now = start + i * STEP_S
        action = health.observe(now, progress, busy=busy)
        if action is not None:
            return now, action
    return None


class TestCanary:
    def test_an_idle_engine_gets_a_canary_after_the_idle_period(self) -> None:
        assert _first(_health(), 0.0, 20.0, busy=False) == (10.0, "send_canary")

    def test_only_one_canary_is_in_flight(self) -> None:
        health = _health()
        _first(health, 0.0, 10.0, busy=False)
        assert _first(health, 10.25, 12.75, busy=False) is None

    def test_progress_restarts_the_idle_period(self) -> None:
        health = _health()
        assert _first(health, 0.0, 8.0, busy=False) is None
        assert _first(health, 8.25, 30.0, busy=False, progress=5) == (18.25, "send_canary")

    def test_a_busy_engine_gets_no_canary(self) -> None:
        health = _health()
        progressing = [health.observe(t * 0.5, t, busy=True) for t in range(1, 60)]
        assert progressing == [None] * 59

    def test_a_canary_finished_in_time_keeps_the_engine_healthy(self) -> None:
        health = _health()
        _first(health, 0.0, 10.0, busy=False)
        assert health.canary_ended(10.5, ok=True) is None
        assert health.healthy
        assert _first(health, 10.5, 14.0, busy=False, progress=1) is None

    def test_the_next_canary_comes_an_idle_period_after_the_last_one(self) -> None:
        health = _health()
        _first(health, 0.0, 10.0, busy=False)
        health.canary_ended(10.5, ok=True)
        assert _first(health, 10.5, 30.0, busy=False) == (20.5, "send_canary")

    def test_a_late_canary_makes_the_engine_unhealthy(self) -> None:
        health = _health()
        _first(health, 0.0, 10.0, busy=False)
        assert _first(health, 10.25, 20.0, busy=True) == (13.0, "unhealthy")
        assert (health.healthy, health.reason) == (False, "canary_timeout")

    def test_a_failed_canary_makes_the_engine_unhealthy(self) -> None:
        health = _health()
        _first(health, 0.0, 10.0, busy=False)
        assert health.canary_ended(10.1, ok=False) == "unhealthy"
        assert health.reason == "canary_failed"

    def test_no_canary_when_the_idle_period_is_zero(self) -> None:
        health = _health(HealthSettings(idle_s=0, timeout_s=3.0, stall_s=30.0))
        assert _first(health, 0.0, 100.0, busy=False) is None

    def test_an_end_without_a_canary_is_ignored(self) -> None:
        assert _health().canary_ended(1.0, ok=False) is None


class TestWatchdog:
    def test_a_busy_engine_without_progress_for_the_stall_period_is_unhealthy(self) -> None:
        health = _health()
        assert _first(health, 0.0, 60.0, busy=True) == (30.0, "unhealthy")
        assert health.reason == "engine_stalled"

    def test_work_after_an_idle_spell_gets_the_whole_stall_period(self) -> None:
        health = _health(HealthSettings(idle_s=0, timeout_s=3.0, stall_s=30.0))
        assert _first(health, 0.0, 100.0, busy=False) is None
        assert _first(health, 100.25, 200.0, busy=True) == (130.25, "unhealthy")

    def test_while_a_canary_is_out_its_deadline_rules(self) -> None:
        health = _health(HealthSettings(idle_s=10.0, timeout_s=3.0, stall_s=1.0))
        _first(health, 0.0, 10.0, busy=False)  # the canary goes out
        assert _first(health, 10.25, 20.0, busy=True) == (13.0, "unhealthy")
        assert health.reason == "canary_timeout"

    def test_a_long_step_shorter_than_the_stall_period_does_not_trip_it(self) -> None:
        health = _health()
        _first(health, 0.0, 1.0, busy=True)
        assert _first(health, 1.25, 30.75, busy=True, progress=1) is None  # a 29.5 s step
        assert _first(health, 31.0, 32.0, busy=True, progress=2) is None

    def test_no_watchdog_when_the_stall_period_is_zero(self) -> None:
        health = _health(HealthSettings(idle_s=10.0, timeout_s=3.0, stall_s=0))
        assert _first(health, 0.0, 100.0, busy=True) is None

    def test_a_stopped_process_is_not_blamed_on_its_engine(self) -> None:
        health = _health()
        assert _first(health, 0.0, 10.0, busy=True) is None
        # SIGSTOP for 60 s: the next look is long after the last one
        assert health.observe(70.0, 0, busy=True) is None
        assert _first(health, 70.25, 200.0, busy=True) == (100.0, "unhealthy")

    def test_a_canary_out_while_the_process_was_stopped_gets_its_whole_deadline(self) -> None:
        health = _health()
        _first(health, 0.0, 10.0, busy=False)
        assert health.observe(70.0, 0, busy=True) is None
        assert _first(health, 70.25, 80.0, busy=True) == (73.0, "unhealthy")


class TestRecovery:
    def _stalled(self) -> EngineHealth:
        health = _health()
        assert _first(health, 0.0, 30.0, busy=True) == (30.0, "unhealthy")
        return health

    def test_an_unhealthy_engine_gets_a_canary_with_no_deadline(self) -> None:
        health = self._stalled()
        assert _first(health, 30.25, 31.0, busy=True) == (30.25, "send_canary")
        assert _first(health, 30.5, 1000.0, busy=True) is None
        assert not health.healthy

    def test_a_finished_canary_brings_the_engine_back(self) -> None:
        health = self._stalled()
        _first(health, 30.25, 31.0, busy=True)
        assert health.canary_ended(45.0, ok=True) == "recovered"
        assert (health.healthy, health.reason) == (True, None)

    def test_the_late_canary_itself_brings_the_engine_back_when_it_finishes(self) -> None:
        health = _health()
        _first(health, 0.0, 10.0, busy=False)
        assert _first(health, 10.25, 13.0, busy=True) == (13.0, "unhealthy")
        assert _first(health, 13.25, 60.0, busy=True) is None  # no second canary
        assert health.canary_ended(60.5, ok=True) == "recovered"

    def test_progress_alone_does_not_bring_the_engine_back(self) -> None:
        health = self._stalled()
        _first(health, 30.25, 31.0, busy=True)
        assert _first(health, 31.25, 40.0, busy=True, progress=50) is None
        assert not health.healthy

    def test_a_failed_canary_of_an_unhealthy_engine_is_sent_again_after_a_pause(self) -> None:
        health = self._stalled()
        _first(health, 30.25, 31.0, busy=True)
        assert health.canary_ended(31.0, ok=False) is None
        assert _first(health, 31.0, 40.0, busy=True) == (34.0, "send_canary")

    def test_after_recovery_the_watchdog_starts_afresh(self) -> None:
        health = self._stalled()
        _first(health, 30.25, 31.0, busy=True)
        health.canary_ended(40.0, ok=True)
        assert _first(health, 40.0, 44.75, busy=False) is None
        assert _first(health, 45.0, 100.0, busy=True) == (75.0, "unhealthy")


class TestSettings:
    def test_the_tick_is_a_quarter_of_the_shortest_timing(self) -> None:
        assert HealthSettings(idle_s=2.0, timeout_s=1.0, stall_s=30.0).tick_s == 0.25

    def test_the_tick_is_bounded(self) -> None:
        assert SETTINGS.tick_s == 0.75
        assert HealthSettings(idle_s=0.01, timeout_s=0.01, stall_s=0).tick_s == 0.05
        assert HealthSettings(idle_s=100, timeout_s=100, stall_s=100).tick_s == 1.0

    def test_everything_off_is_disabled(self) -> None:
        assert not HealthSettings(idle_s=0, timeout_s=3.0, stall_s=0).enabled


class TestPayload:
    def test_the_default_is_one_token_and_one_greedy_output_token(self) -> None:
        payload = parse_payload(DEFAULT_PAYLOAD)
        assert payload.token_ids == (1,)
        assert (payload.sampling.max_tokens, payload.sampling.temperature) == (1, 0.0)

    def test_sampling_defaults_to_one_greedy_token(self) -> None:
        assert parse_payload('{"token_ids": [5, 6]}').sampling.max_tokens == 1

    def test_the_setting_keeps_a_valid_payload_as_given(self) -> None:
        text = '{"token_ids": [7],  "sampling": {"max_tokens": 2}}'
        assert check_payload(text) == text

    @pytest.mark.parametrize(
        ("text", "problem"),
        [
            ("{", "not JSON"),
            ('{"sampling": {}}', "token_ids"),
            ('{"token_ids": []}', "at least one"),
            ('{"token_ids": [-1]}', "non-negative"),
            ('{"token_ids": [1], "sampling": {"max_tokens": 0}}', "max_tokens"),
            ('{"token_ids": [1], "prompt": "hi"}', "prompt"),
            ('{"token_ids": ["a"]}', "int"),
        ],
    )
    def test_a_bad_payload_is_refused_naming_the_problem(self, text: str, problem: str) -> None:
        with pytest.raises(ValueError, match=problem):
            check_payload(text)
