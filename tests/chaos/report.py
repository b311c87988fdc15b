"""Pure: what one chaos run's request records add up to, and whether a scenario met its target:
its correctness part (``broken_rules``, what the tests assert) and its times (``missed_times``,
what ``bench.chaos`` reports: seconds depend on the machine).

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
    """A scenario's target: its kind, a recovery bound where it has one, and its wording (the
    bound is a benchmark figure, never a test's verdict)."""

    goal: Goal
    text: str
    recover_within_s: float | None = None


def broken_rules(target: Target, summary: Summary) -> list[str]:
    """What ``summary`` breaks of ``target``'s correctness part, whatever the times (empty: it
    holds); ``make test`` fails on any of these, never on a slow machine's seconds.

    Every goal: every failure is a typed error of the stack (no hang, drop, cut stream or 500),
    and a request started after the fault was served. ``ZERO_FAILED``: nothing failed.
    ``IN_FLIGHT_ONLY`` / ``AWAITING_FIRST_TOKEN_ONLY``: every failure was in flight (and had no
    token yet) when the fault hit. ``TYPED_WITHIN_DEADLINE``: a request was served after the
    faulted process came back.
    """
    failed = sum(summary.failed.values())
    broken = []
    if summary.failed_untyped:
        broken.append(f"{summary.failed_untyped} failed without a typed error")
    if target.goal is Goal.ZERO_FAILED:
        if failed:
            broken.append(f"{failed} failed")
        if summary.completed == 0:
            broken.append("nothing completed")
        if summary.recover_s is None and summary.counted is Counted.ALL:
            broken.append("nothing started after the fault was served")
        return broken
    if target.goal is Goal.IN_FLIGHT_ONLY and failed > summary.failed_in_flight:
        broken.append(f"{failed - summary.failed_in_flight} failed that were not in flight")
    if target.goal is Goal.AWAITING_FIRST_TOKEN_ONLY and failed > (
        allowed := summary.failed_awaiting_first_token
    ):
        broken.append(f"{failed - allowed} failed that were not awaiting a first token")
    if target.goal is Goal.TYPED_WITHIN_DEADLINE:
        if summary.serving_again_s is None:
            broken.append("nothing was served after the faulted process was back")
    elif summary.recover_s is None:
        broken.append("nothing started after the fault was served")
    return broken


def missed_times(target: Target, summary: Summary) -> list[str]:
    """Which of ``target``'s times ``summary`` missed (empty: none): its recovery bound, and for
    ``TYPED_WITHIN_DEADLINE`` the request deadline. Seconds depend on the machine: these are
    ``bench.chaos``'s figures, never a test's verdict."""
    missed = []
    if target.goal is Goal.TYPED_WITHIN_DEADLINE:
        recovered, what = summary.serving_again_s, "serving again"
        if summary.over_deadline:
            missed.append(f"{summary.over_deadline} took longer than the deadline")
    else:
        recovered, what = summary.recover_s, "recovery"
    bound = target.recover_within_s
    if bound is not None and recovered is not None and recovered >= bound:
        missed.append(f"{what} {recovered:.2f} s, not < {bound:g} s")
    return missed


def is_met(target: Target, summary: Summary) -> bool:
    """Whether ``summary`` meets ``target`` whole: its correctness part and its times."""
    return not broken_rules(target, summary) and not missed_times(target, summary)


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
