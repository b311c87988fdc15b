"""Admission: how many inference requests this gateway serves at once, and which it refuses.

Pure: counters and limits, no I/O and no clock. HTTP (``http/app.py``) and gRPC
(``grpc/service.py``) share one ``Admission``: a request takes a slot before any work is done
for it and gives it back once its response has ended, however it ended.

Each slot is taken for an *owner*, the client connection it came on (an HTTP/1.1 or HTTP/2
connection; ``None`` for none). One owner holds at most ``per_owner`` slots, a share of the
limit, so a few connections that stop reading their answers cannot take every slot (the send
timeout then frees the ones they hold).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from contextlib import contextmanager

from shared.errors import Overloaded

RETRY_AFTER_S = 1.0
"""What a refused client is told to wait (``Retry-After``): one second, as for the other 503s;
a slot frees as soon as any response ends."""
CONNECTION_SHARE = 0.25
"""The share of the slots one connection may hold by default."""


class Admission:
    """Counts the requests in flight; refuses one that would go over ``limit`` (0 = no limit)
    or over its connection's share of it (``connection_share``; 1 = no share).

    ``try_enter(owner)`` / ``leave(owner)``, or ``with admission.slot(owner):`` (raises
    ``Overloaded`` when full; leaves on the way out, exception or cancellation included).
    """

    __slots__ = ("_in_flight", "_owners", "_rejected", "limit", "per_owner", "retry_after_s")

    def __init__(
        self,
        limit: int = 0,
        *,
        connection_share: float = CONNECTION_SHARE,
        retry_after_s: float = RETRY_AFTER_S,
    ) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0 (0 = no limit), got {limit}")
        if not 0 < connection_share <= 1:
            raise ValueError(f"connection_share must be in (0, 1], got {connection_share}")
        self.limit = limit
        self.per_owner = (
            max(1, math.ceil(limit * connection_share)) if limit and connection_share < 1 else 0
        )
        """Slots one owner may hold (0 = only the limit)."""
        self.retry_after_s = retry_after_s
        self._in_flight = 0
        self._rejected = 0
        self._owners: dict[Hashable, int] = {}

    @property
    def in_flight(self) -> int:
        """Requests holding a slot right now."""
        return self._in_flight

    @property
    def rejected(self) -> int:
        """Requests refused since start."""
        return self._rejected

    def held_by(self, owner: Hashable) -> int:
        """Slots ``owner`` holds right now."""
        return self._owners.get(owner, 0)

    def try_enter(self, owner: Hashable | None = None) -> bool:
        """Take a slot (True), or count a refusal (False) when all ``limit`` are taken or
        ``owner`` holds its share."""
        if self.limit and self._in_flight >= self.limit:
            self._rejected += 1
            return False
        if owner is not None and self.per_owner:
            held = self._owners.get(owner, 0)
            if held >= self.per_owner:
                self._rejected += 1
                return False
            self._owners[owner] = held + 1
        self._in_flight += 1
        return True

    def leave(self, owner: Hashable | None = None) -> None:
        """Give a slot back; exactly once per successful ``try_enter(owner)``."""
        if self._in_flight <= 0:
            raise RuntimeError("Admission.leave() without a slot taken")
        self._in_flight -= 1
        if owner is not None and self.per_owner:
            held = self._owners.get(owner, 0)
            if held <= 1:
                self._owners.pop(owner, None)
            else:
                self._owners[owner] = held - 1

    def refusal(self, owner: Hashable | None = None) -> Overloaded:
        """The error a refused request is answered with (503 / UNAVAILABLE, ``Retry-After``):
        the gateway's limit when that is what is full, else the connection's share."""
        is_full = self.limit and self._in_flight >= self.limit
        if not is_full and owner is not None and self.per_owner:
            held = self.held_by(owner)
            return Overloaded(
                f"This connection holds {held} request{'s' if held != 1 else ''} in flight, "
                f"its share of the gateway's {self.limit}; retry after {self.retry_after_s:g} s "
                "or use another connection.",
                retry_after_s=self.retry_after_s,
            )
        return Overloaded(
            f"The gateway is serving its limit of {self.limit} concurrent requests; "
            f"retry after {self.retry_after_s:g} s.",
            retry_after_s=self.retry_after_s,
        )

    @contextmanager
    def slot(self, owner: Hashable | None = None) -> Iterator[None]:
        """Hold a slot for the block; ``Overloaded`` when none is free."""
        if not self.try_enter(owner):
            raise self.refusal(owner)
        try:
            yield
        finally:
            self.leave(owner)
