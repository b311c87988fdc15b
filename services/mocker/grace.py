"""When a worker decides a request's formatter is gone (decision 018): pure bookkeeping.

A bounced token batch starts a grace of ``FORMATTER_GRACE_S`` per (request, attempt); the
request keeps generating. When the grace ends, a batch sent after the latest bounce that has not
bounced within ``BOUNCE_WAIT_S`` means the formatter came back (it moved to another NATS node);
otherwise, if the worker still holds that attempt, the formatter is gone. No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FORMATTER_GRACE_S = 3.0
"""How long a worker keeps generating a request whose batches bounce: a formatter moving to
another NATS node is away for ~0.1 s; one that is gone lets the grace run out."""
BOUNCE_WAIT_S = 0.5
"""A batch that has not bounced this long after it was sent was delivered (a bounce comes back
within milliseconds)."""

Outcome = Literal["gone", "back", "dropped"]
"""``gone``: stop the request, tell its gateway; ``back``: the formatter is receiving again;
``dropped``: the worker no longer holds that attempt (finished, cancelled, replaced)."""


@dataclass(slots=True)
class _Grace:
    attempt: int
    ends_at: float
    sent_after_bounce_at: float | None = None
    """When the first batch after the latest bounce went out (``None``: none since)."""


class FormatterGrace:
    """Requests whose batches bounced, each with its grace; one entry (one timer) per request."""

    __slots__ = ("_grace_s", "_graces")

    def __init__(self, grace_s: float = FORMATTER_GRACE_S) -> None:
        self._grace_s = grace_s
        self._graces: dict[str, _Grace] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._graces

    def __len__(self) -> int:
        return len(self._graces)

    def bounced(self, request_id: str, attempt: int, now: float) -> bool:
        """Note a bounce of ``attempt``'s batch; True when a new grace starts (start a timer)."""
        grace = self._graces.get(request_id)
        if grace is None:
            self._graces[request_id] = _Grace(attempt, now + self._grace_s)
            return True
        if grace.attempt != attempt:  # a new attempt came here: its own grace, the same timer
            grace.attempt, grace.ends_at = attempt, now + self._grace_s
        grace.sent_after_bounce_at = None
        return False

    def sent(self, request_id: str, now: float) -> None:
        """Note a batch sent for ``request_id`` (cheap when it has no grace)."""
        grace = self._graces.get(request_id)
        if grace is not None and grace.sent_after_bounce_at is None:
            grace.sent_after_bounce_at = now

    def check(self, request_id: str, held_attempt: int | None, now: float) -> Outcome | float:
        """The outcome of ``request_id``'s grace (then forgotten), or when to check again.

        ``held_attempt``: the attempt of the request the worker holds now (``None``: none).
        A grace whose verdict waits for a recent batch is bounded by ``BOUNCE_WAIT_S``; past
        that, bounces that keep coming mean ``gone``.
        """
        grace = self._graces.get(request_id)
        if grace is None:
            return "dropped"
        if held_attempt != grace.attempt:
            del self._graces[request_id]
            return "dropped"
        if now < grace.ends_at:
            return grace.ends_at
        sent_at = grace.sent_after_bounce_at
        if sent_at is not None and now - sent_at >= BOUNCE_WAIT_S:
            del self._graces[request_id]
            return "back"
        if sent_at is not None and now < grace.ends_at + BOUNCE_WAIT_S:
            return sent_at + BOUNCE_WAIT_S
        del self._graces[request_id]
        return "gone"

    def clear(self) -> None:
        """Forget every grace (the worker stops)."""
        self._graces.clear()
