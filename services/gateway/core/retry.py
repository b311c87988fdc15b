"""Resubmission of a request that failed before anything reached its client. Pure: the clock
is passed in.

A hop that was missing for a moment (a preprocessor, router or formatter being restarted or
drained: NATS "no responders", ``shutting_down``), or a formatter that died with the request
(``formatter_lost``), is no reason to fail a client that has seen nothing yet: the gateway sends
the request again under a new id, with backoff, within a budget (``--retry-budget-s``) that
starts at its first failure: a request lost in transit is only known lost after the gateway's
probes (decision 018), seconds after it was sent.
Overload (busy, 529) is never retried here: shedding it is the point.
"""

from __future__ import annotations

from dataclasses import dataclass

RESUBMITTABLE = frozenset(
    {"service_unavailable", "shutting_down", "formatter_lost", "no_worker_available"}
)
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 0.5


@dataclass(slots=True)
class RetryBudget:
    """How long a request may keep being resubmitted, and how often it was."""

    budget_s: float
    started_at: float | None = None
    """The first failure (``None``: none yet)."""
    attempts: int = 0

    def delay(self, code: str, now: float) -> float | None:
        """Seconds to wait before resubmitting after ``code``, or ``None``: give up."""
        if code not in RESUBMITTABLE or self.budget_s <= 0:
            return None
        if self.started_at is None:
            self.started_at = now
        delay = min(MAX_DELAY_S, FIRST_DELAY_S * 2.0**self.attempts)
        if now + delay - self.started_at > self.budget_s:
            return None
        self.attempts += 1
        return delay


def attempt_id(request_id: str, attempt: int) -> str:
    """The bus id of a resubmission (a subject token, like the original)."""
    return f"{request_id}-r{attempt}"
