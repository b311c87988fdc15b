"""Simulated log-probabilities: at most 0, top lists sorted with probabilities summing to at most
1, the sampled token first when greedy, deterministic."""

from __future__ import annotations

import math

import pytest

from services.mocker.logprobs import is_greedy, token_logprob
from shared.messages import SamplingParams

VOCAB = tuple(range(1000, 1100))


@pytest.mark.parametrize("k", [0, 1, 5, 20])
@pytest.mark.parametrize("greedy", [True, False])
def test_values_are_plausible(k: int, greedy: bool) -> None:
    for position in range(200):
        lp = token_logprob(1050, key="s", position=position, k=k, greedy=greedy, vocabulary=VOCAB)
        assert lp.logprob <= 0
        assert len(lp.top) == k
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-9
        assert len({t for t, _ in lp.top}) == k  # distinct ids
        if greedy and k:
            assert lp.top[0] == (1050, lp.logprob)
        if (1050, lp.logprob) not in lp.top and k:
            assert lp.logprob <= lp.top[-1][1]  # not listed: less likely than every listed one


def test_sampling_sometimes_picks_a_less_likely_token() -> None:
    ranks = []
    for position in range(300):
        lp = token_logprob(1050, key="s", position=position, k=5, greedy=False, vocabulary=VOCAB)
        ids = [t for t, _ in lp.top]
        ranks.append(ids.index(1050) if 1050 in ids else len(ids))
    assert ranks.count(0) > 150
    assert any(rank > 0 for rank in ranks)


def test_deterministic_in_key_and_position() -> None:
    def lp(key: str, position: int) -> object:
        return token_logprob(5, key=key, position=position, k=3, greedy=False, vocabulary=VOCAB)

    assert lp("a", 3) == lp("a", 3)
    assert lp("a", 3) != lp("a", 4)
    assert lp("a", 3) != lp("b", 3)


def test_greedy_sampling() -> None:
    assert is_greedy(SamplingParams(temperature=0.0))
    assert is_greedy(SamplingParams(greedy=True))
    assert not is_greedy(SamplingParams(temperature=0.7))
