"""Events that arrive before their request's ``StreamOpen`` (decision 013). Pure: ``now`` is passed.

With a direct open the preprocessor publishes ``StreamOpen`` and ``Generate`` back to back, and
the formatter handles its open and stream subscriptions in separate tasks (and may still be
loading a tokenizer), so a first token batch can beat the open. Such events are held here,
bounded in requests, events per request and age, and replayed in order once the open arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.messages import WorkerEvent

MAX_AGE_S = 2.0
MAX_REQUESTS = 1024
MAX_EVENTS = 256
"""Per request; more than this many batches before the open means something else is wrong."""


@dataclass(slots=True)
class _Held:
    since: float
    events: list[tuple[WorkerEvent, bytes]] = field(default_factory=list)


class EarlyEvents:
    """Per-request queues of ``(event, raw bytes)`` awaiting a ``StreamOpen``."""

    __slots__ = ("_held", "_max_age", "_max_events", "_max_requests")

    def __init__(
        self,
        *,
        max_age_s: float = MAX_AGE_S,
        max_requests: int = MAX_REQUESTS,
        max_events: int = MAX_EVENTS,
    ) -> None:
        self._max_age = max_age_s
        self._max_requests = max_requests
        self._max_events = max_events
        self._held: dict[str, _Held] = {}
        """Insertion order = age order (first event held first)."""

    def __len__(self) -> int:
        """Requests with held events."""
        return len(self._held)

    def hold(self, event: WorkerEvent, raw: bytes, now: float) -> str | None:
        """Keep ``event`` for its request; returns the id of a request evicted to make room."""
        held = self._held.get(event.request_id)
        evicted = None
        if held is None:
            if len(self._held) >= self._max_requests:
                evicted = next(iter(self._held))
                del self._held[evicted]
            held = self._held[event.request_id] = _Held(now)
        if len(held.events) < self._max_events:
            held.events.append((event, raw))
        return evicted

    def take(self, request_id: str) -> list[tuple[WorkerEvent, bytes]]:
        """The events held for ``request_id``, oldest first (and forget them)."""
        held = self._held.pop(request_id, None)
        return held.events if held is not None else []

    def discard(self, request_id: str) -> int:
        """Forget ``request_id``'s events (cancelled, or its open failed); how many there were."""
        held = self._held.pop(request_id, None)
        return len(held.events) if held is not None else 0

    def expire(self, now: float, *, keep: frozenset[str] | set[str] = frozenset()) -> list[str]:
        """Drop requests held longer than ``max_age_s`` (except ``keep``: opens in progress)."""
        expired = []
        for request_id, held in list(self._held.items()):
            if now - held.since <= self._max_age:
                break
            if request_id in keep:
                continue
            del self._held[request_id]
            expired.append(request_id)
        return expired
