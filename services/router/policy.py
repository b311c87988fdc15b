"""Worker selection. Pure: no I/O, no clock, no randomness you did not pass in.

A ``Policy`` sees the request and the live (never empty, not busy) workers of its model and
names one; ``RoutingCore`` handles what every mode shares (empty pools, pinned workers).
"""

from __future__ import annotations

import operator
import random
from collections.abc import Sequence
from typing import Protocol

from shared.messages import Generate, WorkerCard

_worker_id = operator.attrgetter("worker_id")


class Policy(Protocol):
    """Chooses one of ``workers`` (never empty, sorted by worker id) for ``request``."""

    mode: str

    def choose(self, request: Generate, workers: Sequence[WorkerCard]) -> WorkerCard: ...


class RoundRobin:
    """Cycle through the live workers of each model; every model (and a disaggregated model's
    prefill pool) has its own cursor."""

    mode = "round-robin"

    def __init__(self) -> None:
        self._cursors: dict[tuple[str, bool], int] = {}

    def choose(self, request: Generate, workers: Sequence[WorkerCard]) -> WorkerCard:
        ordered = sorted(workers, key=_worker_id)  # already sorted: one linear pass
        # A disaggregated request picks twice (decode pool, prefill pool): one cursor each, or
        # the two picks would step in lockstep and always pair the same workers.
        key = (request.model, ordered[0].role == "prefill")
        cursor = self._cursors.get(key, 0)
        self._cursors[key] = cursor + 1
        return ordered[cursor % len(ordered)]


class Random:
    """Pick uniformly at random from a seeded generator (reproducible with a seed)."""

    mode = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: Generate, workers: Sequence[WorkerCard]) -> WorkerCard:
        return self._rng.choice(sorted(workers, key=_worker_id))


def build_policy(mode: str, *, seed: int | None = None) -> Policy:
    """The policy for ``--router-mode``."""
    if mode == "round-robin":
        return RoundRobin()
    if mode == "random":
        return Random(seed)
    raise ValueError(f"unknown router mode {mode!r}")
