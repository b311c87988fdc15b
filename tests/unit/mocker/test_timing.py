"""Timing model: Dynamo's polynomial coefficients, monotonic in tokens, scaled by speedup."""

from __future__ import annotations

import pytest

from services.mocker.timing import PolynomialTiming

TIMING = PolynomialTiming()
CAPACITY = 16384 * 16


def test_prefill_time_grows_with_new_tokens() -> None:
    times = [TIMING.prefill_ms(n) for n in (1, 16, 128, 1024, 8192, 32768)]
    assert times == sorted(times)
    assert len(set(times)) == len(times)


def test_no_prompt_tokens_cost_no_prefill_time() -> None:
    assert TIMING.prefill_ms(0) == 0.0


def test_decode_time_grows_with_active_kv_tokens() -> None:
    times = [TIMING.decode_ms(n, CAPACITY) for n in (0, 1000, 50_000, 150_000, CAPACITY)]
    assert times == sorted(times)
    assert times[-1] > times[0]


def test_decode_time_is_capped_at_a_full_cache() -> None:
    assert TIMING.decode_ms(10 * CAPACITY, CAPACITY) == TIMING.decode_ms(CAPACITY, CAPACITY)


def test_matches_dynamo_polynomial_values() -> None:
    assert TIMING.prefill_ms(1000) == pytest.approx(4.209989e-07 * 1e6 + 15.18344 + 16.50142)
    assert TIMING.decode_ms(0, CAPACITY) == pytest.approx(5.74)
    assert TIMING.decode_ms(CAPACITY, CAPACITY) == pytest.approx(-25.74 + 54.01 + 5.74)


def test_step_time_is_divided_by_the_speedup_ratio() -> None:
    kwargs = {"prefill_tokens": 512, "decode_seqs": 4, "active_kv_tokens": 2048}
    base = TIMING.step_s(**kwargs, total_kv_tokens=CAPACITY, speedup_ratio=1.0)
    fast = TIMING.step_s(**kwargs, total_kv_tokens=CAPACITY, speedup_ratio=4.0)
    assert fast == pytest.approx(base / 4)


def test_speedup_zero_never_sleeps() -> None:
    step = TIMING.step_s(
        prefill_tokens=4096,
        decode_seqs=64,
        active_kv_tokens=CAPACITY,
        total_kv_tokens=CAPACITY,
        speedup_ratio=0.0,
    )
    assert step == 0.0


def test_step_adds_decode_time_only_when_requests_decode() -> None:
    prefill_only = TIMING.step_s(
        prefill_tokens=100,
        decode_seqs=0,
        active_kv_tokens=100,
        total_kv_tokens=CAPACITY,
        speedup_ratio=1.0,
    )
    assert prefill_only == pytest.approx(TIMING.prefill_ms(100) / 1000)
