"""Worker selection. Pure: no I/O, no clock, no randomness you did not pass in.

A ``Policy`` sees the request and the live workers of its model and names one worker.
``select_worker`` wraps any policy with what every mode shares: an empty pool is a 503, and a
request that pins a worker (``Generate.worker_id``) goes there only while it is live.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

from shared.errors import NotFound, NoWorkerAvailable
from shared.messages import Generate, WorkerCard


class Policy(Protocol):
    """Chooses one of ``workers`` (never empty, sorted by worker id) for ``request``."""

    mode: str

    def choose(self, request: Generate, workers: Sequence[WorkerCard]) -> WorkerCard: ...


class RoundRobin:
    """Cycle through the live workers of each model; every model has its own cursor."""

    mode = "round-robin"

    def __init__(self) -> None:
        self._cursors: dict[str, int] = {}

    def choose(self, request: Generate, workers: Sequence[WorkerCard]) -> WorkerCard:
        ordered = sorted(workers, key=lambda w: w.worker_id)
        cursor = self._cursors.get(request.model, 0)
        self._cursors[request.model] = cursor + 1
        return ordered[cursor % len(ordered)]


class Random:
    """Pick uniformly at random from a seeded generator (reproducible with a seed)."""

    mode = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: Generate, workers: Sequence[WorkerCard]) -> WorkerCard:
        return self._rng.choice(sorted(workers, key=lambda w: w.worker_id))


def build_policy(mode: str, *, seed: int | None = None) -> Policy:
    """The policy for ``--router-mode``."""
    if mode == "round-robin":
        return RoundRobin()
    if mode == "random":
        return Random(seed)
    raise ValueError(f"unknown router mode {mode!r}")


def select_worker(policy: Policy, request: Generate, live: Sequence[WorkerCard]) -> WorkerCard:
    """The worker for ``request`` among the ``live`` workers of its model.

    Raises:
        NoWorkerAvailable: no live worker serves the model (503, retry after 1 s).
        NotFound: the request pins a worker that is not live for its model (404).
    """
    if request.worker_id is not None:
        for card in live:
            if card.worker_id == request.worker_id:
                return card
        raise NotFound(
            f"worker {request.worker_id} is not a live worker of model {request.model}",
            param="worker_id",
        )
    if not live:
        raise NoWorkerAvailable(f"no live worker serves model {request.model}", retry_after_s=1.0)
    return policy.choose(request, live)
