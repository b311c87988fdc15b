"""KV-aware worker cost and selection, as Dynamo's ``DefaultWorkerSelector``. Pure.

For each candidate worker::

    prefill_blocks = (active prefill tokens + new prefill tokens) / block_size
    new prefill tokens = prompt tokens - overlap blocks * block_size
    overlap blocks = the prompt's leading blocks cached on the worker (KV index) or, unless
                     --no-inflight-overlap, being computed there by requests routed earlier
    decode_blocks  = active decode blocks + the prompt's blocks not already active there
    cost           = overlap_weight * prefill_blocks + decode_blocks

(``decode_blocks`` is Dynamo's "potential" decode blocks: what the worker will hold once the
request runs, so piling requests that share a prefix on one worker costs only their tails.)

Temperature 0 picks the lowest cost, a tie broken uniformly at random; above 0 it samples the
softmax of the costs normalized to [0, 1] and divided by the temperature, so the cheapest worker
is the likeliest (Dynamo's ``softmax_sample``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from shared.messages import Candidate, WorkerCard
from shared.targets import worker_of


def worker_cost(
    worker_id: str,
    overlap_blocks: int,
    active_prefill_tokens: int,
    active_decode_blocks: int,
    new_decode_blocks: int,
    prompt_tokens: int,
    block_size: int,
    overlap_weight: float,
    busy: bool = False,
    inflight_blocks: int = 0,
) -> Candidate:
    """The cost of sending a ``prompt_tokens`` prompt to one worker, as a decision candidate.

    ``new_decode_blocks`` are the prompt's blocks not already active on the worker (its partial
    tail included). Positional on purpose: this runs once per worker per request.
    """
    new_prefill = prompt_tokens - overlap_blocks * block_size
    if new_prefill < 0:
        new_prefill = 0
    prefill_blocks = (active_prefill_tokens + new_prefill) / block_size
    decode_blocks = float(active_decode_blocks + new_decode_blocks)
    return Candidate(
        worker_id=worker_id,
        overlap_blocks=overlap_blocks,
        inflight_blocks=inflight_blocks,
        prefill_blocks=prefill_blocks,
        decode_blocks=decode_blocks,
        cost=overlap_weight * prefill_blocks + decode_blocks,
        busy=busy,
    )


def pick(costs: Sequence[float], temperature: float, rng: random.Random) -> int:
    """Index of the chosen cost: argmin (random among ties) at 0, softmax sampling above."""
    if not costs:
        raise ValueError("no candidates")
    if temperature <= 0.0:
        low = min(costs)
        tied = [i for i, c in enumerate(costs) if c == low]
        return tied[0] if len(tied) == 1 else rng.choice(tied)
    return rng.choices(range(len(costs)), weights=softmax_weights(costs, temperature))[0]


def softmax_weights(costs: Sequence[float], temperature: float) -> list[float]:
    """Selection probabilities: ``exp(-(c - min) / ((max - min) * T))``, normalized."""
    low, high = min(costs), max(costs)
    if high == low:
        return [1.0 / len(costs)] * len(costs)
    scale = (high - low) * temperature
    weights = [math.exp(-(c - low) / scale) for c in costs]
    total = sum(weights)
    return [w / total for w in weights]


def allowed_workers(
    live: Sequence[WorkerCard], allowed: Sequence[str] | None
) -> Sequence[WorkerCard]:
    """The live workers a request may go to: all of them, or those ``nvext.allowed_worker_ids``
    names (``RoutingHints.allowed_worker_ids``). An empty result is the caller's "no live
    worker" error, as if the model had none."""
    if allowed is None:
        return live
    names = frozenset(allowed)
    return [card for card in live if worker_of(card.worker_id) in names]
