"""When a worker decides a request's formatter is gone (decision 018): pure bookkeeping.

A bounced token batch starts a grace of ``FORMATTER_GRACE_S`` for the request; it keeps
generating (and may finish) meanwhile, since its formatter may only be moving to another NATS
node. When the grace ends the worker pings the formatter: an answer means it is there (it will
find the request again itself, decision 018), none means it is gone, and the request's gateway
is told. A cancel during the grace (a migration, the client) ends it with no verdict. No I/O,
no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMATTER_GRACE_S = 1.0
"""How long after its first bounce a request's formatter is asked whether it is there: a
formatter moving to another NATS node was away 7 to 90 ms in the cluster tests. (3 s made the
chaos suite's killed formatter take 3.4 s to be told to its clients.)"""


@dataclass(frozen=True, slots=True)
class Grace:
    """One request waiting out its formatter's absence."""

    request_id: str
    attempt: int
    ends_at: float
    formatter_id: str
    gateway: str | None
    """Where to say ``formatter_lost`` (``None``: nowhere)."""


class FormatterGrace:
    """Requests whose batches bounced, each with its grace; one entry (one timer) per request."""

    __slots__ = ("_grace_s", "_graces")

    def __init__(self, grace_s: float = FORMATTER_GRACE_S) -> None:
        self._grace_s = grace_s
        self._graces: dict[str, Grace] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._graces

    def __len__(self) -> int:
        return len(self._graces)

    def bounced(
        self, request_id: str, attempt: int, now: float, *, formatter_id: str, gateway: str | None
    ) -> bool:
        """Note a bounce; True when a new grace starts (start a timer), False while one runs."""
        if request_id in self._graces:
            return False
        self._graces[request_id] = Grace(
            request_id, attempt, now + self._grace_s, formatter_id, gateway
        )
        return True

    def forget(self, request_id: str) -> None:
        """The request was cancelled (migrated away, or its client left): no verdict."""
        self._graces.pop(request_id, None)

    def due(self, request_id: str, now: float) -> Grace | float | None:
        """The ended grace (taken out), when to look again, or ``None``: forgotten."""
        grace = self._graces.get(request_id)
        if grace is None:
            return None
        if now < grace.ends_at:
            return grace.ends_at
        del self._graces[request_id]
        return grace

    def clear(self) -> None:
        """Forget every grace (the worker stops)."""
        self._graces.clear()
