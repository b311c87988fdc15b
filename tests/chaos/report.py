"""Pure: what one chaos run's request records add up to, and whether a scenario met its target.

Times are ``time.monotonic()`` seconds of the process that ran the load, the fault's included.
Nothing here does I/O; ``load.py`` fills the records and ``scenarios.py`` prints the summary.
"""

from __future__ import annotations

import enum
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CATCH_ALL_CODES = frozenset({"internal_error"})
"""Stack error codes that are not a typed answer: the catch-all for an unexpected failure."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One streamed chat completion as the client saw it."""

    start_s: float
    end_s: float
    ok: bool
    first_token_s: float | None = None
    """When the first content arrived (``None``: none did)."""
    status: int | None = None
    """HTTP status of a refused request (``None``: the stream started, or no response at all)."""
    code: str | None = None
    """The stack's error code (``error.code`` of the body or of an in-band SSE error event)."""
    error_class: str | None = None
    """The client-side exception class, or ``incomplete_stream``."""
    text: str = ""
    completion_tokens: int | None = None
    is_migrated: bool = False
    """A response header or an ``nvext`` field said the request was migrated."""
    request_id: str | None = None
    """The ``X-Request-Id`` the gateway answered with (to find the request in the logs)."""

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def served_s(self) -> float:
        """When the stack showed it was serving this request: its first token, else its end."""
        return self.first_token_s if self.first_token_s is not None else self.end_s

    @property
    def failure(self) -> str | None:
        """``None`` when it completed; else a stable key: ``"503 no_worker_available"`` (an
        HTTP error), ``"sse timeout"`` (an in-band error event), or a client-side key."""
        if self.ok:
            return None
        if self.status is not None:
            return f"{self.status} {self.code or 'no_code'}"
        if self.code is not None:
            return f"sse {self.code}"
        return self.error_class or "unknown"

    @property
    def is_typed_failure(self) -> bool:
        """The stack answered with one of its error codes (not a hang, a drop or a 500)."""
        return not self.ok and self.code is not None and self.code not in CATCH_ALL_CODES


class Counted(enum.StrEnum):
    """Which requests a scenario's numbers cover."""

    ALL = "all"
    STARTED_BEFORE_FAULT = "started before the fault"


@dataclass(frozen=True, slots=True)
class Summary:
    """One scenario's numbers, as its JSON line shows them."""

    sent: int
    completed: int
    failed: dict[str, int]
    max_latency_s: float | None
    recover_s: float | None
    """From the fault until the first request started after it was served (first token)."""
    steady_s: float | None
    """From the fault until requests complete steadily again: every request started from then
    on completed (``None`` if the last ones still failed)."""
    failed_in_flight: int
    """Failed requests that were in flight when the fault hit (started before, ended after)."""
    failed_awaiting_first_token: int
    """Of those, the ones that had no token yet when the fault hit: the only ones a process
    that handles a request only until it reaches a worker (preprocessor, router) can hold."""
    failed_untyped: int
    over_deadline: int
    """Requests (failed or not) that took longer than the request deadline."""
    serving_again_s: float | None = None
    """From ``back_at`` (the faulted process back) until a request was served again."""
    counted: Counted = Counted.ALL
    failed_ids: tuple[str, ...] = ()
    """The failed requests' ``X-Request-Id`` (where the gateway answered with one)."""


def summarize(
    records: Sequence[RequestRecord],
    fault_at: float,
    *,
    deadline_s: float,
    back_at: float | None = None,
    counted: Counted = Counted.ALL,
) -> Summary:
    """Add up ``records`` around a fault at ``fault_at`` (and its end at ``back_at``, if any)."""
    kept = [r for r in records if counted is Counted.ALL or r.start_s < fault_at]
    failures = [r for r in kept if not r.ok]
    return Summary(
        sent=len(kept),
        completed=len(kept) - len(failures),
        failed=dict(sorted(Counter(str(r.failure) for r in failures).items())),
        max_latency_s=_round(max((r.latency_s for r in kept), default=None)),
        recover_s=_round(served_after(records, fault_at, fault_at)),
        steady_s=_round(steady_after(records, fault_at)),
        failed_in_flight=sum(1 for r in failures if r.start_s < fault_at <= r.end_s),
        failed_awaiting_first_token=sum(
            1 for r in failures if r.start_s < fault_at <= r.end_s and not _had_token(r, fault_at)
        ),
        failed_untyped=sum(1 for r in failures if not r.is_typed_failure),
        over_deadline=sum(1 for r in kept if r.latency_s > deadline_s),
        serving_again_s=None
        if back_at is None
        else _round(served_after(records, fault_at, back_at)),
        counted=counted,
        failed_ids=tuple(r.request_id for r in failures if r.request_id),
    )


def _had_token(record: RequestRecord, at: float) -> bool:
    return record.first_token_s is not None and record.first_token_s < at


def served_after(records: Iterable[RequestRecord], started_from: float, since: float) -> float:
    """Seconds from ``since`` until the first request started at or after ``started_from``
    that completed was served (its first token, not earlier than ``since``); ``inf`` if none."""
    times = [
        r.served_s for r in records if r.ok and r.start_s >= started_from and r.served_s >= since
    ]
    return min(times) - since if times else math.inf


def steady_after(records: Sequence[RequestRecord], fault_at: float) -> float:
    """Seconds from ``fault_at`` until the first served request started after the last failed
    one (of those started after the fault); ``inf`` if none was served after it."""
    late_failures = [r.start_s for r in records if not r.ok and r.start_s >= fault_at]
    if not late_failures:
        return served_after(records, fault_at, fault_at)
    last_bad = max(late_failures)
    times = [r.served_s for r in records if r.ok and r.start_s > last_bad]
    return min(times) - fault_at if times else math.inf


def _round(value: float | None) -> float | None:
    if value is None or math.isinf(value):
        return None
    return round(max(0.0, value), 3)


class Goal(enum.Enum):
    """The kinds of target the issue sets."""

    ZERO_FAILED = "zero_failed"
    IN_FLIGHT_ONLY = "in_flight_only"
    """Only requests in flight when the fault hit may fail (a process holding every stream)."""
    AWAITING_FIRST_TOKEN_ONLY = "awaiting_first_token_only"
    """Only requests still waiting for their first token when the fault hit may fail."""
    TYPED_WITHIN_DEADLINE = "typed_within_deadline"


@dataclass(frozen=True, slots=True)
class Target:
    """A scenario's target: its kind, a recovery bound where it has one, and its wording."""

    goal: Goal
    text: str
    recover_within_s: float | None = None


def is_met(target: Target, summary: Summary) -> bool:
    """Whether ``summary`` meets ``target``.

    ``ZERO_FAILED``: nothing failed, and something completed after the fault (when every
    request counts). ``IN_FLIGHT_ONLY`` / ``AWAITING_FIRST_TOKEN_ONLY``: every failure was in
    flight (and had no token yet) when the fault hit, and a request started after it was served
    within the bound. ``TYPED_WITHIN_DEADLINE``: every failure is a typed error, nothing
    outlived the deadline, and requests were served within the bound after the faulted process
    came back.
    """
    failed = sum(summary.failed.values())
    if target.goal is Goal.ZERO_FAILED:
        served = summary.recover_s is not None or summary.counted is not Counted.ALL
        return failed == 0 and summary.completed > 0 and served
    if target.goal is Goal.IN_FLIGHT_ONLY:
        return failed == summary.failed_in_flight and _within(summary.recover_s, target)
    if target.goal is Goal.AWAITING_FIRST_TOKEN_ONLY:
        allowed = summary.failed_awaiting_first_token
        return failed == allowed and _within(summary.recover_s, target)
    return (
        summary.failed_untyped == 0
        and summary.over_deadline == 0
        and _within(summary.serving_again_s, target)
    )


def _within(seconds: float | None, target: Target) -> bool:
    if seconds is None:
        return False
    return target.recover_within_s is None or seconds < target.recover_within_s


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def counter_samples(text: str, suffix: str) -> dict[str, float]:
    """Every sample in Prometheus text ``text`` whose metric name ends with ``suffix``, keyed by
    name and labels (``jetserve_migrations_total{service="formatter"}``)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1).endswith(suffix):
            found[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return found


def has_counter(text: str, suffix: str) -> bool:
    """Whether Prometheus text ``text`` declares a counter whose name ends with ``suffix`` (a
    labelled counter has no sample until it first counts, but its ``# TYPE`` line is there)."""
    return any(
        line.startswith("# TYPE ") and line.split()[2].endswith(suffix)
        for line in text.splitlines()
        if len(line.split()) >= 4
    )


def counter_increase(values: Sequence[float]) -> float:
    """How much a counter grew over successive scrapes; a drop is a restart from zero (the
    process was killed and started again), so the value after it counts in full."""
    total = 0.0
    previous = 0.0
    for value in values:
        total += value - previous if value >= previous else value
        previous = value
    return total
