"""Figures from Prometheus text and from timestamped events, for ``jetserve top``. Pure: times are
passed in, nothing is read or fetched here.

``parse`` turns one scrape into ``Samples``; ``Window`` picks the two scrapes a window's rates are
taken between; ``histogram_quantile`` estimates a quantile from bucket counts the way
Prometheus's ``histogram_quantile`` does; ``Tally`` sums events by time for windowed rates.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from shared.metric_names import DEFAULT_PREFIX, canonical

Labels = tuple[tuple[str, str], ...]
"""A sample's labels, sorted by name (hashable)."""


@dataclass(frozen=True, slots=True)
class Samples:
    """One scrape: every sample by (name, labels), and the names of every family it declared
    (a labelled counter no request has touched yet has a family but no sample)."""

    values: Mapping[tuple[str, Labels], float] = field(default_factory=dict)
    families: frozenset[str] = frozenset()

    def select(self, name: str, **match: str) -> Iterable[tuple[dict[str, str], float]]:
        """``(labels, value)`` of every ``name`` sample whose labels include ``match``."""
        for (sample, labels), value in self.values.items():
            if sample != name:
                continue
            as_dict = dict(labels)
            if all(as_dict.get(k) == v for k, v in match.items()):
                yield as_dict, value

    def total(self, name: str, **match: str) -> float | None:
        """The sum of the matching samples; ``None`` when there is none."""
        found = [value for _, value in self.select(name, **match)]
        return math.fsum(found) if found else None

    def by_label(self, name: str, label: str, **match: str) -> dict[str, float]:
        """Matching samples summed per value of ``label``."""
        out: dict[str, float] = {}
        for labels, value in self.select(name, **match):
            key = labels.get(label, "")
            out[key] = out.get(key, 0.0) + value
        return out

    def buckets(self, name: str, **match: str) -> dict[float, float]:
        """A histogram's cumulative ``_bucket`` counts by upper bound, summed over label sets."""
        out: dict[float, float] = {}
        for labels, value in self.select(f"{name}_bucket", **match):
            bound = float(labels["le"])
            out[bound] = out.get(bound, 0.0) + value
        return out


def parse(text: str, prefix: str = DEFAULT_PREFIX) -> Samples:
    """Parse Prometheus text exposition (``ValueError`` when it is not); names that start with
    ``prefix`` (``--metrics-prefix``) are given back as the code writes them (``jetserve_*``)."""
    values: dict[tuple[str, Labels], float] = {}
    families: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            families.add(canonical(family.name, prefix))
            for sample in family.samples:
                key = (canonical(sample.name, prefix), tuple(sorted(sample.labels.items())))
                values[key] = float(sample.value)
    except (ValueError, IndexError, KeyError) as exc:  # the parser's errors are not one type
        raise ValueError(f"not Prometheus text: {exc}") from exc
    return Samples(values, frozenset(families))


@dataclass(frozen=True, slots=True)
class Scrape:
    """One endpoint's samples at monotonic time ``at`` (``error`` set: the fetch failed)."""

    url: str
    at: float
    samples: Samples = field(default_factory=Samples)
    error: str = ""


@dataclass(frozen=True, slots=True)
class Window:
    """The newest good scrape of an endpoint, and the one a window's changes are taken from."""

    old: Scrape | None
    new: Scrape

    @property
    def span_s(self) -> float:
        return self.new.at - self.old.at if self.old is not None else 0.0

    def delta(self, name: str, **match: str) -> float | None:
        """How much the matching counters grew in the window (a restart counts from 0)."""
        return self.growth(lambda samples: samples.total(name, **match))

    def growth(self, count: Callable[[Samples], float | None]) -> float | None:
        """How much ``count`` (a counter read from a scrape) grew in the window."""
        if self.old is None:
            return None
        new = count(self.new.samples)
        if new is None:
            return None
        old = count(self.old.samples) or 0.0
        return new - old if new >= old else new

    def per_s(self, grown: float | None) -> float | None:
        """An amount grown in the window, per second."""
        return grown / self.span_s if grown is not None and self.span_s > 0 else None

    def bucket_delta(self, name: str, **match: str) -> dict[float, float]:
        """A histogram's bucket counts gained in the window (empty without two scrapes)."""
        if self.old is None:
            return {}
        new = self.new.samples.buckets(name, **match)
        old = self.old.samples.buckets(name, **match)
        gained = {le: n - old.get(le, 0.0) for le, n in new.items()}
        return new if any(v < 0 for v in gained.values()) else gained


def window(history: Sequence[Scrape], now: float, window_s: float) -> Window | None:
    """Between the newest good scrape and the newest one at least ``window_s`` older (else the
    oldest good one); ``None`` when no scrape of the endpoint has succeeded."""
    good = [s for s in history if not s.error]
    if not good:
        return None
    new = good[-1]
    older = [s for s in good[:-1] if s.at <= new.at - window_s]
    old = older[-1] if older else (good[0] if len(good) > 1 else None)
    return Window(old, new)


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Quantile ``q`` of cumulative ``buckets`` (upper bound → count), interpolated linearly
    inside the bucket it falls in; ``None`` with no observations. Like Prometheus, a quantile
    in the ``+Inf`` bucket is the highest finite bound."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def quantile(q: float, values: Sequence[float]) -> float | None:
    """Quantile ``q`` of ``values`` (linear between the nearest ranks); ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class Tally:
    """Amounts recorded over time, summed per ``resolution_s`` slot, kept for ``keep_s``."""

    __slots__ = ("_keep_s", "_resolution_s", "_slots")

    def __init__(self, keep_s: float, resolution_s: float = 0.1) -> None:
        self._keep_s = keep_s
        self._resolution_s = resolution_s
        self._slots: deque[list[float]] = deque()
        """``[slot start, amount, events]``, oldest first."""

    def add(self, at: float, amount: float = 1.0) -> None:
        start = math.floor(at / self._resolution_s) * self._resolution_s
        if self._slots and self._slots[-1][0] >= start:
            self._slots[-1][1] += amount
            self._slots[-1][2] += 1
        else:
            self._slots.append([start, amount, 1])
        while self._slots and self._slots[0][0] < at - self._keep_s:
            self._slots.popleft()

    def since(self, start: float) -> tuple[float, int]:
        """The amount and the number of events recorded at or after ``start``."""
        amount, events = 0.0, 0
        for slot_start, slot_amount, slot_events in reversed(self._slots):
            if slot_start + self._resolution_s <= start:
                break
            amount += slot_amount
            events += int(slot_events)
        return amount, events
