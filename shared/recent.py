"""A bounded, expiring set of ids (e.g. requests cancelled before they arrived). Pure."""

from __future__ import annotations

from collections import OrderedDict


class RecentIds:
    """Remembers ids for ``ttl_s`` seconds, at most ``max_size`` of them (oldest dropped)."""

    def __init__(self, ttl_s: float = 60.0, max_size: int = 10_000) -> None:
        self._ttl_s = ttl_s
        self._max = max_size
        self._seen: OrderedDict[str, float] = OrderedDict()

    def add(self, key: str, now: float) -> None:
        self._seen[key] = now
        self._seen.move_to_end(key)
        self._prune(now)

    def pop(self, key: str, now: float) -> bool:
        """True (and forget it) if ``key`` was added less than ``ttl_s`` ago."""
        self._prune(now)
        return self._seen.pop(key, None) is not None

    def _prune(self, now: float) -> None:
        while self._seen:
            key, at = next(iter(self._seen.items()))
            if len(self._seen) <= self._max and now - at < self._ttl_s:
                break
            del self._seen[key]

    def __contains__(self, key: object) -> bool:
        """True if ``key`` was added (and not yet pruned; pruning happens on ``add``/``pop``)."""
        return key in self._seen

    def __len__(self) -> int:
        return len(self._seen)
