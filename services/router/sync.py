"""Keep the KV index exact from the event stream: per-worker ``event_id`` order, gaps, dumps.

Pure: the wiring (``kv_feed.py``) feeds it stream messages and dump replies and acts on what it
returns. Each worker numbers its ``KvEventBatch``es 1, 2, 3, ... with no gaps, so

* ``event_id <= last`` is a replay (after a snapshot, or a redelivery) and is skipped;
* ``event_id == last + 1`` is applied;
* ``event_id > last + 1`` is a gap: the batch is held and the worker is asked for a full dump
  (``KvDump``, a snapshot of its cache as of some ``event_id``); the dump replaces the worker's
  blocks and the held batches newer than the dump are applied;
* ``event_id == 1`` from a worker seen before means it restarted under the same id (the stream
  delivers each message once): its old blocks are dropped and the batch applied.

Events carry the data-parallel rank whose cache changed: the index keys blocks by routing target
(``shared.targets``), while ``event_id`` order, gaps and dumps stay per worker.

A stream sequence at or below the last one consumed is a redelivery (a consumer re-created
after a nats-server restart starts where this one stopped, and may overlap): it is skipped
before any of the rules above, so a replayed batch 1 never looks like a restarted worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from services.router.indexer import IndexSnapshot, RadixIndex
from shared.messages import KvDump, KvEventBatch
from shared.targets import SEPARATOR, target_id, worker_of


class Outcome(Enum):
    """What ``KvSync.on_batch`` did with a batch."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    GAP = "gap"
    """Held; the caller must request a dump of the worker (``begin_dump`` was called)."""
    HELD = "held"
    """Held behind a dump already in flight."""


@dataclass
class KvSync:
    """An index plus the stream position and per-worker ``event_id`` it reflects."""

    index: RadixIndex = field(default_factory=RadixIndex)
    last_event_id: dict[str, int] = field(default_factory=dict)
    stream_seq: int = 0
    """The last stream sequence consumed (applied, skipped or held)."""
    held: dict[str, list[KvEventBatch]] = field(default_factory=dict)
    """Workers with a dump in flight, and the batches that arrived meanwhile."""

    def on_batch(self, batch: KvEventBatch, stream_seq: int = 0) -> Outcome:
        """Consume one stream message (its stream sequence, when known)."""
        if stream_seq:
            if stream_seq <= self.stream_seq:
                return Outcome.DUPLICATE
            self.stream_seq = stream_seq
        worker_id = batch.worker_id
        waiting = self.held.get(worker_id)
        if waiting is not None:
            waiting.append(batch)
            return Outcome.HELD
        last = self.last_event_id.get(worker_id, 0)
        if batch.event_id == 1 and worker_id in self.last_event_id:
            # The stream delivers each message once, so a second batch 1 is a new incarnation.
            for target in self._targets(worker_id):
                self.index.clear(target)
            last = 0
        if batch.event_id <= last:
            return Outcome.DUPLICATE
        if batch.event_id > last + 1:
            self.held[worker_id] = [batch]
            return Outcome.GAP
        self._apply(batch)
        return Outcome.APPLIED

    def _apply(self, batch: KvEventBatch) -> None:
        worker_id, index = batch.worker_id, self.index
        for event in batch.events:
            index.apply(target_id(worker_id, event.dp_rank) if event.dp_rank else worker_id, event)
        self.last_event_id[worker_id] = batch.event_id

    def _targets(self, worker_id: str) -> list[str]:
        """The worker's targets the index knows (itself, and its ranks above 0)."""
        prefix = worker_id + SEPARATOR
        return [w for w in self.index.workers() if w == worker_id or w.startswith(prefix)]

    def apply_dump(self, dump: KvDump) -> Iterator[Outcome]:
        """Replace the worker's blocks with ``dump``, then replay the batches held meanwhile.

        Yields what happened to each held batch; a further gap holds the rest again (the
        caller requests another dump when it sees ``Outcome.GAP``).
        """
        waiting = self.held.pop(dump.worker_id, [])
        by_target: dict[str, list[int]] = {t: [] for t in self._targets(dump.worker_id)}
        by_target.setdefault(dump.worker_id, [])
        for stored in dump.events:
            target = target_id(dump.worker_id, stored.dp_rank)
            by_target.setdefault(target, []).extend(stored.block_hashes)
        for target, hashes in by_target.items():
            self.index.replace_worker(target, hashes)
        self.last_event_id[dump.worker_id] = dump.event_id
        yield from self._replay(waiting)

    def abandon_dump(self, worker_id: str) -> Iterator[Outcome]:
        """No dump came: accept the gap and apply the held batches in order (best effort)."""
        waiting = self.held.pop(worker_id, [])
        if waiting:
            self.last_event_id[worker_id] = waiting[0].event_id - 1
        yield from self._replay(waiting)

    def _replay(self, batches: list[KvEventBatch]) -> Iterator[Outcome]:
        for i, batch in enumerate(batches):
            outcome = self.on_batch(batch)
            yield outcome
            if outcome is Outcome.GAP:
                self.held[batch.worker_id].extend(batches[i + 1 :])
                return

    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker that left the registry; True when it was known."""
        self.held.pop(worker_id, None)
        known = self.last_event_id.pop(worker_id, None) is not None
        for target in self._targets(worker_id):
            known = self.index.remove_worker(target) or known
        return known

    def workers(self) -> set[str]:
        """Workers with blocks (on any rank), an ``event_id`` or a dump in flight."""
        workers = {worker_of(t) for t in self.index.workers()}
        return workers | set(self.last_event_id) | set(self.held)

    @property
    def is_settled(self) -> bool:
        """No dump in flight: a snapshot now would be consistent with ``stream_seq``."""
        return not self.held

    def snapshot(self, *, router_id: str = "", created_at: float = 0.0) -> IndexSnapshot:
        """The state as of ``stream_seq`` (take it only while ``is_settled``)."""
        return self.index.snapshot(
            stream_seq=self.stream_seq,
            last_event_ids=self.last_event_id,
            router_id=router_id,
            created_at=created_at,
        )

    @classmethod
    def restore(cls, snapshot: IndexSnapshot) -> KvSync:
        """Rebuild from a snapshot; consume the stream from ``stream_seq + 1`` next."""
        index, last = RadixIndex.restore(snapshot)
        return cls(index=index, last_event_id=last, stream_seq=snapshot.stream_seq)
