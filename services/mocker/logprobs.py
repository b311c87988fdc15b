"""Plausible, deterministic log-probabilities for the tokens the mocker emits (pure).

Each value is a function of the request's key (seed or prompt hash, and choice) and the token's
position, so a request repeated gets the same numbers. The sampled token's log-probability is
at most 0; ``top`` holds ``k`` alternatives, most likely first, whose probabilities sum to at
most 1. With greedy sampling (``greedy`` or temperature 0) the sampled token is the most likely
one, so it comes first; otherwise it is usually first, sometimes lower, sometimes not in the
list at all, as with a real sampler.

A simulator has no logits, so ``min_p``, ``repetition_penalty`` and ``logit_bias`` change
nothing here; only greedy sampling shows (the sampled token is always the top one).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from shared.messages import SamplingParams, TokenLogprob

MIN_LOGPROB = -30.0


def is_greedy(sampling: SamplingParams) -> bool:
    """Always the most likely token: ``greedy`` (``nvext.greed_sampling``) or temperature 0."""
    return sampling.greedy or sampling.temperature == 0.0


def token_logprob(
    token: int,
    *,
    key: str,
    position: int,
    k: int,
    greedy: bool,
    vocabulary: Sequence[int],
) -> TokenLogprob:
    """The ``TokenLogprob`` of ``token`` at ``position``; alternatives come from ``vocabulary``
    (plain tokens, e.g. the corpus), never ``token`` itself."""
    rng = random.Random(f"lp:{key}:{position}")
    count = max(k, 1)
    probs = _decreasing(rng, count + 1)
    rank = 0 if greedy or rng.random() < 0.75 else rng.randint(1, count)
    sampled = probs[rank]
    others = _alternatives(rng, token, count, vocabulary)
    ranked: list[tuple[int, float]] = []
    j = 0
    for i, p in enumerate(probs[:count]):
        if i == rank:
            ranked.append((token, _log(p)))
        else:
            ranked.append((others[j], _log(p)))
            j += 1
    return TokenLogprob(logprob=_log(sampled), top=tuple(ranked[:k]))


def _decreasing(rng: random.Random, count: int) -> list[float]:
    """``count`` strictly decreasing probabilities summing to less than 1."""
    probs = [rng.uniform(0.45, 0.97)]
    left = 1.0 - probs[0]
    for _ in range(count - 1):
        p = min(probs[-1] * rng.uniform(0.2, 0.7), left * rng.uniform(0.3, 0.8))
        p = max(p, 1e-12)
        if p >= probs[-1]:
            p = probs[-1] / 2
        probs.append(p)
        left -= p
    return probs


def _alternatives(
    rng: random.Random, token: int, count: int, vocabulary: Sequence[int]
) -> list[int]:
    """``count`` distinct ids other than ``token`` (from ``vocabulary``, then nearby ids)."""
    seen = {token}
    out: list[int] = []
    for _ in range(count * 4):
        if len(out) == count or not vocabulary:
            break
        candidate = vocabulary[rng.randrange(len(vocabulary))]
        if candidate not in seen:
            seen.add(candidate)
            out.append(candidate)
    candidate = token
    while len(out) < count:
        candidate += 1
        if candidate not in seen:
            seen.add(candidate)
            out.append(candidate)
    return out


def _log(p: float) -> float:
    return max(MIN_LOGPROB, round(math.log(p), 6)) if p > 0 else MIN_LOGPROB
