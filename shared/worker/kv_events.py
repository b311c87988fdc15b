"""Numbering of a worker's KV events and when to report its load.

Pure: the service feeds engine events in and sends what comes out. ``KvEventLog`` turns pending
events into ``KvEventBatch`` messages whose ``event_id`` counts from 1 with no gaps, except on
purpose: when pending events overflow (the bus is down for long), they are dropped and one id
is skipped, so routers see a gap and ask for a dump instead of trusting a lossy stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from shared.messages import AnyKvEvent, KvEventBatch

MAX_PENDING_EVENTS = 100_000


class KvEventLog:
    """Pending events → numbered batches, oldest first; ``pop`` once a batch is stored."""

    def __init__(self, worker_id: str, *, max_pending: int = MAX_PENDING_EVENTS) -> None:
        self.worker_id = worker_id
        self.last_event_id = 0
        """The id of the newest sealed batch (0 = none yet)."""
        self.dropped_events = 0
        self._max_pending = max_pending
        self._pending: list[AnyKvEvent] = []
        self._sealed: deque[KvEventBatch] = deque()

    def __len__(self) -> int:
        """Events not yet sent (pending or in sealed batches)."""
        return len(self._pending) + sum(len(b.events) for b in self._sealed)

    def add(self, events: Iterable[AnyKvEvent]) -> None:
        """Queue events in order; on overflow drop them all and skip one id (a gap)."""
        self._pending.extend(events)
        if len(self._pending) > self._max_pending:
            self.dropped_events += len(self._pending)
            self._pending.clear()
            self.last_event_id += 1

    def seal(self, now: float) -> int:
        """Number the pending events as one batch; return the newest id (what a dump covers)."""
        if self._pending:
            self.last_event_id += 1
            batch = KvEventBatch(
                worker_id=self.worker_id,
                event_id=self.last_event_id,
                events=tuple(self._pending),
                ts=now,
            )
            self._pending = []
            self._sealed.append(batch)
        return self.last_event_id

    def oldest(self) -> KvEventBatch | None:
        """The oldest sealed batch not yet sent (pending events stay pending)."""
        return self._sealed[0] if self._sealed else None

    def pop(self) -> None:
        """The front batch is stored: forget it."""
        self._sealed.popleft()


@dataclass(slots=True)
class LoadReporter:
    """Report load on change, at most every ``min_interval_s``, at once when idle, and
    unchanged every ``heartbeat_s``: routers settle their count with it (a change between two
    reports, a request come and gone, is never seen) and a silent worker's report goes stale."""

    min_interval_s: float = 0.05
    heartbeat_s: float = 1.0
    _last: tuple[int, ...] | None = None
    _last_at: float = float("-inf")

    def may_report(self, now: float, *, is_idle: bool = False) -> bool:
        """Cheap pre-check: False while the interval since the last report has not passed."""
        return is_idle or now - self._last_at >= self.min_interval_s

    def due(self, snapshot: tuple[int, ...], now: float, *, is_idle: bool = False) -> bool:
        """True when ``snapshot`` should be published now (and remembers it as published)."""
        if snapshot == self._last and now - self._last_at < self.heartbeat_s:
            return False
        if not is_idle and now - self._last_at < self.min_interval_s:
            return False
        self._last, self._last_at = snapshot, now
        return True
