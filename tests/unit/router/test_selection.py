"""Cost formula, argmin tie-breaking and temperature sampling distributions."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from services.router.selection import pick, softmax_weights, worker_cost


def test_cost_is_weighted_prefill_blocks_plus_decode_blocks() -> None:
    # 4 of 100 prompt tokens' blocks cached, 32 prefill tokens and 10 blocks already active
    cost = worker_cost("w", 4, 32, 10, 3, 100, 16, 2.0)
    assert cost.prefill_blocks == (32 + (100 - 4 * 16)) / 16
    assert cost.decode_blocks == 10 + 3
    assert cost.cost == 2.0 * (68 / 16) + 13


def test_overlap_beyond_the_prompt_never_makes_prefill_negative() -> None:
    assert worker_cost("w", 10, 0, 0, 0, 50, 16, 1.0).cost == 0


def test_zero_temperature_picks_the_lowest_cost() -> None:
    assert pick([5.0, 3.0, 7.0, 3.5], 0.0, random.Random(0)) == 1


def test_ties_are_broken_uniformly_and_not_always_by_the_first_index() -> None:
    rng = random.Random(1)
    picks = Counter(pick([2.0, 1.0, 1.0, 1.0, 9.0], 0.0, rng) for _ in range(3000))
    assert set(picks) == {1, 2, 3}
    for index in (1, 2, 3):
        assert 850 < picks[index] < 1150, picks


def test_softmax_weights_follow_dynamo_normalization() -> None:
    """p ~ exp(-(c - min) / ((max - min) * T)): costs 0, 3, 9 at T=1 give e^0, e^-1/3, e^-1."""
    raw = [1.0, math.exp(-1 / 3), math.exp(-1)]
    assert softmax_weights([0.0, 3.0, 9.0], 1.0) == [pytest.approx(r / sum(raw)) for r in raw]


def test_equal_costs_sample_uniformly_at_any_temperature() -> None:
    assert softmax_weights([4.0, 4.0, 4.0, 4.0], 0.5) == [0.25] * 4


def test_temperature_sampling_matches_the_softmax_distribution() -> None:
    costs = [10.0, 12.0, 20.0]
    weights = softmax_weights(costs, 1.0)
    rng = random.Random(7)
    n = 20_000
    picks = Counter(pick(costs, 1.0, rng) for _ in range(n))
    for index, weight in enumerate(weights):
        assert picks[index] / n == pytest.approx(weight, abs=0.015)


def test_higher_temperature_flattens_the_distribution() -> None:
    costs = [10.0, 12.0, 20.0]
    cold, hot = softmax_weights(costs, 0.1), softmax_weights(costs, 10.0)
    assert cold[0] > 0.8
    assert max(hot) - min(hot) < 0.05


def test_no_candidates_is_an_error() -> None:
    with pytest.raises(ValueError, match="no candidates"):
        pick([], 0.0, random.Random(0))
