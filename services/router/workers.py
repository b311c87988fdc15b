"""Which workers' routing state to drop once they leave the registry. Pure: ``now`` is passed in.

A worker that was registered and is gone (card deleted or expired) is dropped at once. A worker
that was never seen registered may just be early (its KV events and load reports can precede its
card), so it gets a grace of one worker TTL before its state is dropped.
"""

from __future__ import annotations

from collections.abc import Set


class WorkerTracker:
    """Remembers which workers were seen live, and since when unregistered ones have had state."""

    __slots__ = ("_seen_live", "_unregistered_since", "ttl_s")

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._seen_live: set[str] = set()
        self._unregistered_since: dict[str, float] = {}

    def departed(self, known: Set[str], live: Set[str], now: float) -> list[str]:
        """The workers with state here (``known``) whose state to drop now, in id order.

        Args:
            known: workers the router holds any state for (index, load, reports).
            live: workers with a live card in the registry.
            now: the current time (same clock as the cards' heartbeats).
        """
        self._seen_live |= live
        # Grace only while an unregistered worker still has state and still has no card.
        since = self._unregistered_since
        for worker_id in [w for w in since if w in live or w not in known]:
            del since[worker_id]
        drop = []
        for worker_id in sorted(known - live):
            if worker_id not in self._seen_live:
                first = since.setdefault(worker_id, now)
                if now - first < self.ttl_s:
                    continue
            self._seen_live.discard(worker_id)
            since.pop(worker_id, None)
            drop.append(worker_id)
        return drop
