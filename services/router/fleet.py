"""One model's live workers as a routing decision needs them, built once per change. Pure.

A decision over a thousand workers must not walk them all: the registry hands the router the
same list object while the model's workers stay the same (``LiveWorkers.for_model``), and
``FleetCache`` builds the sorted ids, the id set, the block size and the event-less workers
from it only when that object changes.

A fleet is of routing targets (``shared.targets``): a worker with ``dp_size`` N contributes N
target cards, named ``<worker_id>#<rank>`` above rank 0, so the index, the load and the scoring
treat each rank as a worker of its own. A model whose workers have roles (``prefill``,
``decode``) is *disaggregated*: its fleet carries the prefill targets and the decode targets
(roles ``decode`` and ``both``) as fleets of their own.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import msgspec

from shared.messages import WorkerCard
from shared.targets import target_id

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
    prefill: Fleet | None = None
    """A disaggregated model's prefill targets (None: the model is aggregated)."""
    decode: Fleet | None = None
    """A disaggregated model's decode targets (roles ``decode`` and ``both``)."""

    @classmethod
    def of(cls, cards: Sequence[WorkerCard]) -> Fleet:
        """The fleet of live worker ``cards`` (each rank of a data-parallel worker a target)."""
        if any(c.dp_size > 1 for c in cards):
            cards = [t for c in cards for t in rank_cards(c)]
        fleet = cls._plain(cards)
        if all(c.role == "both" for c in cards):
            return fleet
        prefill = cls._plain([c for c in cards if c.role == "prefill"])
        decode = cls._plain([c for c in cards if c.role != "prefill"])
        return replace(fleet, prefill=prefill, decode=decode)

    @classmethod
    def _plain(cls, cards: Sequence[WorkerCard]) -> Fleet:
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

    def subset(self, cards: Sequence[WorkerCard]) -> Fleet:
        """A fleet of some of this fleet's target cards (roles kept apart as here)."""
        return Fleet.of(cards) if self.prefill is not None else Fleet._plain(cards)

    @property
    def is_disaggregated(self) -> bool:
        return self.prefill is not None

    def __len__(self) -> int:
        return len(self.ids)


class FleetCache:
    """The ``Fleet`` of the last card list seen per model, rebuilt when the list object changes.

    The registry keeps one list per model while its membership holds (a heartbeat replaces a
    card in place, its id and settings unchanged), so identity is the change signal; any other
    list (a filtered one, a test's) is simply built afresh.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[Sequence[WorkerCard], int, Fleet]] = {}

    def get(self, model: str, cards: Sequence[WorkerCard]) -> Fleet:
        entry = self._last.get(model)
        if entry is not None and entry[0] is cards and entry[1] == len(cards):
            return entry[2]
        fleet = Fleet.of(cards)
        self._last[model] = (cards, len(cards), fleet)
        return fleet


def rank_cards(card: WorkerCard) -> list[WorkerCard]:
    """The target cards of a worker: itself, or one per data-parallel rank (``dp_size`` 1 each,
    so a fleet of targets never expands twice)."""
    if card.dp_size <= 1:
        return [card]
    return [
        msgspec.structs.replace(card, worker_id=target_id(card.worker_id, rank), dp_size=1)
        for rank in range(card.dp_size)
    ]
