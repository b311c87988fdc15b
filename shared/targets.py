"""Routing targets: a worker with ``dp_size`` N data-parallel ranks is N targets. Pure.

A target is named by a string so that everything keyed by "worker" in the router (the KV index,
the active load, the candidates of a decision) keys by target unchanged: rank 0 is the worker id
itself, rank r > 0 is ``<worker_id>#<r>``. A worker without data parallelism (``dp_size`` 1, every
worker before issue 24) is one target named as the worker, so nothing about it changes. ``#``
never occurs in a worker id (worker ids are subject tokens, ``shared.subjects.is_token``, and the
registry refuses ``#``); targets never go into a subject.
"""

from __future__ import annotations

SEPARATOR = "#"


def target_id(worker_id: str, dp_rank: int = 0) -> str:
    """The target of ``worker_id``'s rank ``dp_rank``."""
    return worker_id if dp_rank == 0 else f"{worker_id}{SEPARATOR}{dp_rank}"


def split_target(target: str) -> tuple[str, int]:
    """``(worker_id, dp_rank)`` of a target."""
    worker_id, sep, rank = target.partition(SEPARATOR)
    return (worker_id, int(rank)) if sep else (target, 0)


def worker_of(target: str) -> str:
    """The worker id of a target."""
    return target.partition(SEPARATOR)[0]
