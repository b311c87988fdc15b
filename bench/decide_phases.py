"""What the second routing phase costs the router's decision (issue 24).

    python -m bench.decide_phases

``RoutingCore.decide`` in kv mode over 4 aggregated workers, then over 2 prefill + 2 decode
workers (two pools scored, one decision), for a 46-token and a 6000-token prompt whose block
hashes came from the preprocessor; the two fleets alternated twice, each figure the median of 5
batches of 3000 decisions (µs per decision). Pure CPU, no bus: the messages the second phase
adds are counted by ``make bench-hops ARGS=--disagg``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections.abc import Sequence

from services.router.core import CoreSettings, RoutingCore
from shared.hashing import prefix_hashes
from shared.messages import Generate, SamplingParams, WorkerCard

BATCH = 3000
BATCHES = 5


def _cards(roles: Sequence[str]) -> list[WorkerCard]:
    return [
        WorkerCard(worker_id=f"w{i}", model="m", block_size=16, kv_blocks=4096, role=role)  # type: ignore[arg-type]
        for i, role in enumerate(roles)
    ]


def decide_us(fleet: list[WorkerCard], tokens: int) -> float:
    """Median µs per decision of a fresh core over ``fleet`` for a ``tokens``-token prompt."""
    core = RoutingCore(CoreSettings(mode="kv"))
    ids = tuple(range(tokens))
    gen = Generate(
        request_id="r",
        model="m",
        token_ids=ids,
        sampling=SamplingParams(),
        stream_to="s",
        block_hashes=tuple(prefix_hashes(ids, 16)),
        hash_block_size=16,
    )
    rng = random.Random(0)
    for _ in range(200):
        core.decide(gen, fleet, now=0, rng=rng)
    batches = []
    for _ in range(BATCHES):
        start = time.perf_counter()
        for _ in range(BATCH):
            core.decide(gen, fleet, now=0, rng=rng)
        batches.append((time.perf_counter() - start) / BATCH * 1e6)
    return statistics.median(batches)


def main() -> None:
    aggregated = _cards(["both"] * 4)
    disaggregated = _cards(["prefill"] * 2 + ["decode"] * 2)
    for tokens in (46, 6000):
        runs: dict[str, list[float]] = {"aggregated_4": [], "prefill_2_decode_2": []}
        for _ in range(2):
            runs["aggregated_4"].append(round(decide_us(aggregated, tokens), 2))
            runs["prefill_2_decode_2"].append(round(decide_us(disaggregated, tokens), 2))
        line = {"bench": "decide_phases", "prompt_tokens": tokens, "decide_us": runs}
        print(json.dumps({**line, "load1": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
