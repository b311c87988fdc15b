"""LoRA adapter placement: which worker should load or unload which adapter, from the workers'
cards and the requests in flight. Pure: no I/O, no clock (decision 031).

An adapter is *under-served* when its requests in flight per holder exceed ``min_inflight`` and
its holders have on average more than ``imbalance`` times the fleet's mean requests in flight
per worker: one more worker
then loads it, the least loaded one that does not hold it (and is less loaded than the
adapter's holders are by it alone). A worker that would then hold more than its ``max_loras``
drops, in the same plan, its coldest adapter that another worker also holds. Cold copies are
dropped from workers over their ``max_loras`` when the other holders can take their requests.
Last holders are never dropped: an adapter held by one worker stays served there, swapped in by
its engine on demand. One adapter changes at most once per ``cooldown_s`` (the caller passes the
adapters changed lately), so a plan's effect shows in the demand before the next.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from shared.messages import WorkerCard

__all__ = [
    "Action",
    "AdapterDemand",
    "PlacementSettings",
    "WorkerView",
    "holders",
    "plan",
    "views",
]


def holders(cards: Iterable[WorkerCard], lora: str) -> list[WorkerCard]:
    """The cards of the workers that hold adapter ``lora``."""
    return [c for c in cards if any(a.name == lora for a in c.loras)]


@dataclass(frozen=True, slots=True)
class PlacementSettings:
    """When an adapter gets another holder, or loses one."""

    min_inflight: float = 4.0
    """An adapter with at most this many requests in flight per holder never gets another."""
    imbalance: float = 1.5
    """...nor one whose holders have at most this times the fleet's mean requests in flight
    per worker."""


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What placement needs of one worker."""

    worker_id: str
    loras: Mapping[str, str]
    """Adapter -> path, as its card says."""
    max_loras: int
    inflight: int = 0
    """Requests in flight on it (any adapter or none)."""


@dataclass(frozen=True, slots=True)
class Action:
    """One command to one worker (``LoadLoraAdapter`` / ``UnloadLoraAdapter``)."""

    kind: Literal["load", "unload"]
    worker_id: str
    lora_name: str
    lora_path: str = ""


class AdapterDemand:
    """Requests in flight per worker and per adapter, from every replica's decisions."""

    def __init__(self) -> None:
        self._where: dict[str, tuple[str, str]] = {}
        """Request id -> (worker id, adapter or "")."""
        self.by_worker: Counter[str] = Counter()
        self.by_adapter: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._where)

    def add(self, request_id: str, worker_id: str, lora: str) -> None:
        """A request was routed (a migrated one moves)."""
        self.free(request_id)
        self._where[request_id] = (worker_id, lora)
        self.by_worker[worker_id] += 1
        if lora:
            self.by_adapter[lora] += 1

    def free(self, request_id: str) -> None:
        """A request finished, was cancelled or expired."""
        where = self._where.pop(request_id, None)
        if where is None:
            return
        worker_id, lora = where
        _decrement(self.by_worker, worker_id)
        if lora:
            _decrement(self.by_adapter, lora)

    def keep_only(self, live: set[str]) -> None:
        """Forget the requests of workers that left (their requests migrate as new ones)."""
        for request_id, (worker_id, _) in list(self._where.items()):
            if worker_id not in live:
                self.free(request_id)


def _decrement(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def views(cards: Iterable[WorkerCard], demand: AdapterDemand) -> list[WorkerView]:
    """One view per worker that serves adapters (``max_loras`` > 0), by worker id."""
    return sorted(
        (
            WorkerView(
                worker_id=c.worker_id,
                loras={a.name: a.path for a in c.loras},
                max_loras=c.max_loras,
                inflight=demand.by_worker.get(c.worker_id, 0),
            )
            for c in cards
            if c.max_loras > 0
        ),
        key=lambda v: v.worker_id,
    )


def plan(
    workers: Sequence[WorkerView],
    demand: Mapping[str, int],
    *,
    settings: PlacementSettings,
    cooling: frozenset[str] = frozenset(),
) -> list[Action]:
    """The next commands (none when placement is as good as these rules make it): one adapter
    gets a holder (and its new holder may drop a cold copy), or one cold copy is dropped."""
    if len(workers) < 2:
        return []
    held: dict[str, list[WorkerView]] = {}
    for worker in workers:
        for lora in worker.loras:
            held.setdefault(lora, []).append(worker)
    grow = _under_served(workers, held, demand, settings, cooling)
    if grow:
        return grow
    return _cold_copy(workers, held, demand, settings, cooling)


def _per_holder(
    lora: str, held: Mapping[str, list[WorkerView]], demand: Mapping[str, int]
) -> float:
    return demand.get(lora, 0) / max(1, len(held.get(lora, ())))


def _under_served(
    workers: Sequence[WorkerView],
    held: Mapping[str, list[WorkerView]],
    demand: Mapping[str, int],
    settings: PlacementSettings,
    cooling: frozenset[str],
) -> list[Action]:
    mean = sum(w.inflight for w in workers) / len(workers)
    ranked = sorted(
        (lora for lora in held if lora not in cooling and len(held[lora]) < len(workers)),
        key=lambda lora: (-_per_holder(lora, held, demand), lora),
    )
    for lora in ranked:
        per = _per_holder(lora, held, demand)
        if per <= settings.min_inflight:
            return []
        busy = sum(w.inflight for w in held[lora]) / len(held[lora])
        if busy <= settings.imbalance * mean:
            continue
        others = [w for w in workers if lora not in w.loras and w.inflight < per]
        if not others:
            continue
        target = min(others, key=lambda w: (w.inflight, len(w.loras), w.worker_id))
        path = held[lora][0].loras[lora]
        actions = [Action("load", target.worker_id, lora, path)]
        if len(target.loras) >= target.max_loras:
            spare = [
                other
                for other in target.loras
                if len(held[other]) > 1 and other not in cooling and other != lora
            ]
            if spare:
                coldest = min(spare, key=lambda o: (_per_holder(o, held, demand), o))
                actions.append(Action("unload", target.worker_id, coldest))
        return actions
    return []


def _cold_copy(
    workers: Sequence[WorkerView],
    held: Mapping[str, list[WorkerView]],
    demand: Mapping[str, int],
    settings: PlacementSettings,
    cooling: frozenset[str],
) -> list[Action]:
    for worker in workers:
        if len(worker.loras) <= worker.max_loras:
            continue
        spare = [
            lora
            for lora in worker.loras
            if len(held[lora]) > 1
            and lora not in cooling
            and demand.get(lora, 0) / (len(held[lora]) - 1) <= settings.min_inflight
        ]
        if spare:
            coldest = min(spare, key=lambda lora: (_per_holder(lora, held, demand), lora))
            return [Action("unload", worker.worker_id, coldest)]
    return []
