"""Worker liveness as a router sees it: which workers to probe, which are lost. Pure: ``now``
is passed in (decision 017).

A router probes the workers it has requests in flight on (``ping``, request/reply). NATS answers
"no responders" within a millisecond of a worker's connection closing, so a crash is known at
the next probe; a worker that stays silent (probes time out) for ``unresponsive_s`` is lost too.
A lost worker is left out of routing until it heartbeats again after the loss (a restarted
process with the same id), or answers a probe again: a lost worker whose card is still live is
probed too (``lost_due``), because on a NATS cluster "no responders" may only mean that it is
moving to another node, while its heartbeats can take seconds to be written (the bucket's
leader may have been on the node that went). Its card may stay in the registry for a TTL.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.messages import WorkerCard

FORGET_LOST_S = 3600.0
"""A loss mark older than this is dropped (the card expired long ago)."""


class Liveness:
    """Outstanding probes, silences, and the workers declared lost (with when)."""

    __slots__ = ("_lost", "_sent", "_silent_since", "unresponsive_s")

    def __init__(self, unresponsive_s: float) -> None:
        self.unresponsive_s = unresponsive_s
        self._sent: dict[str, float] = {}
        """Probes in flight: worker -> when sent."""
        self._silent_since: dict[str, float] = {}
        """Workers whose last probe timed out: since when they have not answered."""
        self._lost: dict[str, float] = {}

    def due(self, workers: Iterable[str], now: float) -> list[str]:
        """The workers to probe now (those without a probe in flight), marked as probed."""
        due = [w for w in workers if w not in self._sent and w not in self._lost]
        for worker_id in due:
            self._sent[worker_id] = now
        return due

    def lost_due(self, workers: Iterable[str], now: float) -> list[str]:
        """The lost ones of ``workers`` (live cards) to probe again now, marked as probed."""
        due = [w for w in workers if w in self._lost and w not in self._sent]
        for worker_id in due:
            self._sent[worker_id] = now
        return due

    def answered(self, worker_id: str) -> bool:
        """A probe was answered; True if the worker was lost (it is back: no longer lost)."""
        self._sent.pop(worker_id, None)
        self._silent_since.pop(worker_id, None)
        return self._lost.pop(worker_id, None) is not None

    def timed_out(self, worker_id: str, now: float) -> bool:
        """A probe got no answer in time; True once the worker has been silent too long."""
        sent = self._sent.pop(worker_id, now)
        since = self._silent_since.setdefault(worker_id, sent)
        return now - since >= self.unresponsive_s

    def dropped(self, worker_id: str) -> None:
        """The probe could not be sent (NATS is down): nothing learned."""
        self._sent.pop(worker_id, None)

    def lose(self, worker_id: str, now: float) -> bool:
        """Declare the worker lost; False if it already was (by this replica or a peer)."""
        self._silent_since.pop(worker_id, None)
        if worker_id in self._lost:
            self._sent.pop(worker_id, None)  # a probe of a lost worker, unanswered
            return False
        self._sent.pop(worker_id, None)
        self._lost[worker_id] = now
        return True

    def any_lost(self) -> bool:
        """Whether some worker is counted lost (else no card needs ``is_lost``)."""
        return bool(self._lost)

    def is_lost(self, card: WorkerCard) -> bool:
        """True while the card's last heartbeat is older than the worker's loss."""
        at = self._lost.get(card.worker_id)
        return at is not None and card.heartbeat_at <= at

    def revive(self, cards: Iterable[WorkerCard], now: float) -> list[str]:
        """Forget the losses of workers that heartbeat again (or were lost long ago)."""
        revived = [c.worker_id for c in cards if c.worker_id in self._lost and not self.is_lost(c)]
        stale = [w for w, at in self._lost.items() if now - at > FORGET_LOST_S]
        for worker_id in (*revived, *stale):
            self._lost.pop(worker_id, None)
        return revived

    def has_lost(self, worker_id: str) -> bool:
        """Whether ``worker_id`` is declared lost now."""
        return worker_id in self._lost

    @property
    def lost(self) -> set[str]:
        return set(self._lost)
