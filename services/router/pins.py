"""Pinned workers and ranks, as the seed reads them, checked against the live fleet. Pure.

A request pins its decode (or aggregated) worker with ``nvext.decode_worker_id`` or
``nvext.backend_instance_id`` (``Generate.worker_id``), its prefill worker with
``nvext.prefill_worker_id``, and either one's data-parallel rank with ``nvext.dp_rank`` /
``nvext.prefill_dp_rank`` (or the ``x-dynamo-*`` headers). A pin is honoured or refused, never
silently re-routed:

* a worker the registry does not know, a worker of another model, a worker of the wrong role
  (a prefill worker pinned for decode, or the reverse) or a rank out of the worker's range is a
  400 naming the field;
* a worker the registry knows but that is not live (its card expired, or the router lost it)
  is a 503 with ``Retry-After``: it may come back;
* a rank without its worker is a 400 (the seed reads a rank only with a pinned worker).

A pinned worker without a pinned rank lets the router choose among its ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.router.fleet import Fleet
from shared.errors import InvalidRequest, NoWorkerAvailable
from shared.messages import Generate, RoutingHints, WorkerCard
from shared.targets import target_id, worker_of

DECODE_PARAM = "nvext.backend_instance_id"
DP_RANK_PARAM = "nvext.dp_rank"
PREFILL_PARAM = "nvext.prefill_worker_id"
PREFILL_DP_RANK_PARAM = "nvext.prefill_dp_rank"

KnownCard = Callable[[str], WorkerCard | None]
"""A worker's card from the registry whatever its state (live, expired, lost), or None."""


@dataclass(frozen=True, slots=True)
class Pins:
    """The targets each phase is restricted to (None: not pinned)."""

    decode: tuple[WorkerCard, ...] | None = None
    prefill: tuple[WorkerCard, ...] | None = None


NO_PINS = Pins()


def resolve(gen: Generate, fleet: Fleet, known: KnownCard) -> Pins:
    """The targets ``gen``'s pins allow in ``fleet`` (raises ``InvalidRequest`` / 503)."""
    hints = gen.routing
    if gen.worker_id is None and (
        hints is None or (hints.prefill_worker_id is None and not _ranks(hints))
    ):
        return NO_PINS
    hints = hints or RoutingHints()
    decode_param = hints.decode_worker_id_param or DECODE_PARAM
    if hints.dp_rank is not None and gen.worker_id is None:
        raise InvalidRequest(
            f"`{DP_RANK_PARAM}` picks a rank of a pinned worker: pin the worker too "
            "(`nvext.decode_worker_id` or `nvext.backend_instance_id`)",
            param=DP_RANK_PARAM,
        )
    if hints.prefill_dp_rank is not None and hints.prefill_worker_id is None:
        raise InvalidRequest(
            f"`{PREFILL_DP_RANK_PARAM}` picks a rank of a pinned prefill worker: set "
            f"`{PREFILL_PARAM}` too",
            param=PREFILL_DP_RANK_PARAM,
        )
    decode = prefill = None
    if gen.worker_id is not None:
        decode = _targets(gen, fleet, known, gen.worker_id, decode_param)
        if decode[0].role == "prefill":
            raise InvalidRequest(
                f"worker {gen.worker_id} is a prefill worker: pin it with `{PREFILL_PARAM}`",
                param=decode_param,
            )
        decode = _rank(decode, gen.worker_id, hints.dp_rank, DP_RANK_PARAM)
    if hints.prefill_worker_id is not None:
        worker_id = hints.prefill_worker_id
        prefill = _targets(gen, fleet, known, worker_id, PREFILL_PARAM)
        if prefill[0].role != "prefill":
            raise InvalidRequest(
                f"worker {worker_id} is not a prefill worker (its role is {prefill[0].role})",
                param=PREFILL_PARAM,
            )
        prefill = _rank(prefill, worker_id, hints.prefill_dp_rank, PREFILL_DP_RANK_PARAM)
    return Pins(decode=decode, prefill=prefill)


def _ranks(hints: RoutingHints) -> bool:
    return hints.dp_rank is not None or hints.prefill_dp_rank is not None


def _targets(
    gen: Generate, fleet: Fleet, known: KnownCard, worker_id: str, param: str
) -> tuple[WorkerCard, ...]:
    """The live targets of a pinned worker of ``gen``'s model, or the error saying why none."""
    targets = tuple(c for c in fleet.cards if worker_of(c.worker_id) == worker_id)
    if targets:
        return targets
    card = known(worker_id)
    if card is None:
        raise InvalidRequest(f"worker {worker_id} is not a known worker", param=param)
    if card.model != gen.model:
        raise InvalidRequest(
            f"worker {worker_id} serves model {card.model}, not {gen.model}", param=param
        )
    raise NoWorkerAvailable(f"worker {worker_id} is not live", retry_after_s=1.0)


def _rank(
    targets: tuple[WorkerCard, ...], worker_id: str, rank: int | None, param: str
) -> tuple[WorkerCard, ...]:
    if rank is None:
        return targets
    wanted = target_id(worker_id, rank)
    chosen = tuple(c for c in targets if c.worker_id == wanted)
    if not chosen:
        raise InvalidRequest(
            f"worker {worker_id} has {len(targets)} data-parallel rank(s): rank {rank} is out "
            "of range",
            param=param,
        )
    return chosen
