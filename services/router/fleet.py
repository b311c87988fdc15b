"""One model's live workers as a routing decision needs them, built once per change. Pure.

A decision over a thousand workers must not walk them all: the registry hands the router the
same list object while the model's workers stay the same (``LiveWorkers.for_model``), and
``FleetCache`` builds the sorted ids, the id set, the block size and the event-less workers
from it only when that object changes.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.messages import WorkerCard

DEFAULT_BLOCK_SIZE = 16

_worker_id = operator.attrgetter("worker_id")


@dataclass(frozen=True, slots=True)
class Fleet:
    """Live workers of one model, by worker id."""

    cards: tuple[WorkerCard, ...]
    ids: tuple[str, ...]
    """Sorted."""
    members: frozenset[str]
    position: dict[str, int] = field(repr=False)
    """Worker id -> its index in ``ids``."""
    block_size: int
    """The block size the prompt is hashed at: the lowest worker id's (all share one)."""
    eventless: tuple[str, ...]
    """Workers whose engine publishes no KV events."""

    @classmethod
    def of(cls, cards: Sequence[WorkerCard]) -> Fleet:
        ordered = tuple(sorted(cards, key=_worker_id))
        ids = tuple(c.worker_id for c in ordered)
        return cls(
            cards=ordered,
            ids=ids,
            members=frozenset(ids),
            position={w: i for i, w in enumerate(ids)},
            block_size=(ordered[0].block_size if ordered else 0) or DEFAULT_BLOCK_SIZE,
            eventless=tuple(c.worker_id for c in ordered if not c.kv_events),
        )

    def __len__(self) -> int:
        return len(self.ids)


class FleetCache:
    """The ``Fleet`` of the last card list seen per model, rebuilt when the list object changes.

    The registry keeps one list per model while its membership holds (a heartbeat replaces a
    card in place, its id and settings unchanged), so identity is the change signal; any other
    list (a filtered one, a test's) is simply built afresh.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[Sequence[WorkerCard], Fleet]] = {}

    def get(self, model: str, cards: Sequence[WorkerCard]) -> Fleet:
        entry = self._last.get(model)
        if entry is not None and entry[0] is cards and len(entry[1]) == len(cards):
            return entry[1]
        fleet = Fleet.of(cards)
        self._last[model] = (cards, fleet)
        return fleet
