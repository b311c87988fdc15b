"""Admission: how many inference requests this gateway serves at once, and which it refuses.

Pure: a counter and a limit, no I/O and no clock. HTTP (``app.py``) and gRPC
(``grpc_service.py``) share one ``Admission``: a request takes a slot before any work is done
for it and gives it back once its response has ended, however it ended.
"""

from __future__ import annotations

from types import TracebackType

from shared.errors import Overloaded

RETRY_AFTER_S = 1.0
"""What a refused client is told to wait (``Retry-After``): one second, as for the other 503s;
a slot frees as soon as any response ends."""


class Admission:
    """Counts the requests in flight; refuses one that would go over ``limit`` (0 = no limit).

    ``try_enter()`` / ``leave()``, or ``with admission:`` (raises ``Overloaded`` when full;
    leaves on the way out, exception or cancellation included).
    """

    __slots__ = ("_in_flight", "_rejected", "limit", "retry_after_s")

    def __init__(self, limit: int = 0, *, retry_after_s: float = RETRY_AFTER_S) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0 (0 = no limit), got {limit}")
        self.limit = limit
        self.retry_after_s = retry_after_s
        self._in_flight = 0
        self._rejected = 0

    @property
    def in_flight(self) -> int:
        """Requests holding a slot right now."""
        return self._in_flight

    @property
    def rejected(self) -> int:
        """Requests refused since start."""
        return self._rejected

    def try_enter(self) -> bool:
        """Take a slot (True), or count a refusal (False) when all ``limit`` are taken."""
        if self.limit and self._in_flight >= self.limit:
            self._rejected += 1
            return False
        self._in_flight += 1
        return True

    def leave(self) -> None:
        """Give a slot back; exactly once per successful ``try_enter()``."""
        if self._in_flight <= 0:
            raise RuntimeError("Admission.leave() without a slot taken")
        self._in_flight -= 1

    def refusal(self) -> Overloaded:
        """The error a refused request is answered with (503 / UNAVAILABLE, ``Retry-After``)."""
        return Overloaded(
            f"The gateway is serving its limit of {self.limit} concurrent requests; "
            f"retry after {self.retry_after_s:g} s.",
            retry_after_s=self.retry_after_s,
        )

    def __enter__(self) -> None:
        if not self.try_enter():
            raise self.refusal()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.leave()
