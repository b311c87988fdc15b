"""Which formatter takes the next request without a handshake (decision 013). Pure: ``now`` is
passed in.

The pool holds formatter ids learned from ``StreamOpened`` replies. ``pick`` hands them out
round-robin, or returns ``None`` when the caller should use the queue-group request/reply
instead: the pool is empty, or a refresh is due (so new formatters are discovered and join the
rotation). Entries not confirmed for ``ttl_s`` are forgotten; a bounced direct open drops one.
"""

from __future__ import annotations

REFRESH_S = 1.0
"""At most one discovery round trip per this many seconds (under load)..."""
REFRESH_EVERY = 16
"""...and at least this many direct opens between two discoveries (at low rates)."""
TTL_S = 30.0
"""A formatter not seen in a ``StreamOpened`` for this long leaves the rotation."""
MAX_SIZE = 64


class FormatterPool:
    """Live formatter ids, round-robin, with periodic rediscovery."""

    __slots__ = (
        "_every",
        "_ids",
        "_last_refresh",
        "_max",
        "_next",
        "_order",
        "_refresh_s",
        "_since",
        "_ttl",
    )

    def __init__(
        self,
        *,
        refresh_s: float = REFRESH_S,
        refresh_every: int = REFRESH_EVERY,
        ttl_s: float = TTL_S,
        max_size: int = MAX_SIZE,
    ) -> None:
        self._refresh_s = refresh_s
        self._every = refresh_every
        self._ttl = ttl_s
        self._max = max_size
        self._ids: dict[str, float] = {}
        """formatter id -> when a ``StreamOpened`` last named it."""
        self._order: tuple[str, ...] = ()
        self._next = 0
        self._last_refresh = float("-inf")
        self._since = 0
        """Direct opens since the last discovery."""

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, formatter_id: object) -> bool:
        return formatter_id in self._ids

    def learn(self, formatter_id: str, now: float) -> None:
        """A formatter answered ``StreamOpen``: it is alive and takes direct opens."""
        if formatter_id not in self._ids:
            if len(self._ids) >= self._max:
                del self._ids[min(self._ids, key=self._ids.__getitem__)]
            self._ids[formatter_id] = now
            self._order = tuple(self._ids)
        else:
            self._ids[formatter_id] = now

    def drop(self, formatter_id: str) -> None:
        """A direct open bounced (or the entry is stale): the formatter is gone."""
        if self._ids.pop(formatter_id, None) is not None:
            self._order = tuple(self._ids)

    def clear(self) -> None:
        """The queue group itself has no responders: no formatter is left."""
        self._ids.clear()
        self._order = ()

    def pick(self, now: float) -> str | None:
        """The formatter for the next request, or ``None`` = discover via request/reply now."""
        if now - self._last_refresh >= self._refresh_s and self._since >= self._every:
            self._last_refresh = now
            self._since = 0
            return None
        while self._order:
            self._next = (self._next + 1) % len(self._order)
            formatter_id = self._order[self._next]
            if now - self._ids[formatter_id] <= self._ttl:
                self._since += 1
                return formatter_id
            self.drop(formatter_id)
        self._since = 0
        self._last_refresh = now
        return None
