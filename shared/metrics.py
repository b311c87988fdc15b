"""Prometheus metrics every service shares, and the ``/metrics`` endpoint of the bus services.

Each service builds one ``ServiceMetrics`` (its own registry, so tests can build many) and adds
its own instruments to ``metrics.registry``. ``serve_metrics(port)`` starts a small HTTP server
for bus services; the gateway serves ``/metrics`` from its own HTTP app instead.

Names are written with the default prefix (``jetserve_``); ``--metrics-prefix`` is applied where
the registry is exposed (``exposition(prefix)``, ``serve_metrics(..., prefix=...)``: the
``exposed`` view renames every family at scrape time), so it reaches every instrument of every
module, whoever declared it (``shared.metric_names``).

Messages handled and handler latency are counted on the per-token path, so they are kept in plain
Python counters (``HandlerStats``: no lock, about 0.5 µs per message against ~2.5 µs for a
``prometheus_client`` Counter plus Histogram) and turned into Prometheus samples at scrape time.
One event-loop thread writes them; a scrape from the HTTP thread may see one message counted
in ``_total`` before its latency bucket, never a torn value.
"""

from __future__ import annotations

import copy
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from types import TracebackType

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
    start_http_server,
)
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.metric_names import DEFAULT_PREFIX, prefixed

LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


class KindStats:
    """Messages of one kind: how many, and a latency histogram of those timed."""

    __slots__ = ("buckets", "count", "seconds")

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        """Per-bucket (not cumulative) counts; the last one is ``+Inf``."""

    def inc(self) -> None:
        """Count one message without timing it."""
        self.count += 1

    def observe(self, seconds: float) -> None:
        """Count one message that took ``seconds``."""
        self.count += 1
        self.seconds += seconds
        self.buckets[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1


class HandlerStats(Collector):
    """``jetserve_messages_total`` and ``jetserve_handler_seconds`` by ``service`` and ``kind``.

    ``labels(service, kind)`` gives the ``KindStats`` to ``inc()`` or ``observe()``, as a
    ``prometheus_client`` metric's child would.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._kinds: dict[tuple[str, str], KindStats] = {}
        registry.register(self)

    def labels(self, service: str, kind: str) -> KindStats:
        stats = self._kinds.get((service, kind))
        if stats is None:
            stats = self._kinds[(service, kind)] = KindStats()
        return stats

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily("jetserve_messages", "Bus messages handled, by kind")
        yield HistogramMetricFamily("jetserve_handler_seconds", "Time spent in a message handler")

    def collect(self) -> Iterator[Metric]:
        messages = CounterMetricFamily(
            "jetserve_messages", "Bus messages handled, by kind", labels=["service", "kind"]
        )
        seconds = HistogramMetricFamily(
            "jetserve_handler_seconds",
            "Time spent in a message handler",
            labels=["service", "kind"],
        )
        for labels, stats in list(self._kinds.items()):
            messages.add_metric(list(labels), stats.count)
            counts, total = list(stats.buckets), stats.seconds
            if not any(counts):
                continue
            cumulative, running = [], 0
            for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), counts, strict=True):
                running += n
                cumulative.append((_le(bound), float(running)))
            seconds.add_metric(list(labels), cumulative, sum_value=total)
        yield messages
        yield seconds


class ServiceMetrics:
    """The instruments every service has: messages handled, handler latency, errors, in flight."""

    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.service = service
        self.registry = registry or CollectorRegistry()
        self.handlers = HandlerStats(self.registry)
        self.messages = self.handlers
        """``messages.labels(service, kind).inc()`` counts a message without timing it."""
        self.handler_seconds = self.handlers
        """``handler_seconds.labels(service, kind).observe(s)`` counts and times a message."""
        self.errors = Counter(
            "jetserve_errors_total",
            "Requests failed, by error code",
            ["service", "code"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "jetserve_in_flight",
            "Requests held right now (queue depth)",
            ["service"],
            registry=self.registry,
        )
        self._codes: dict[str, Counter] = {}

    def handling(self, kind: str) -> _Handling:
        """``with metrics.handling(kind):`` counts one message of ``kind`` and times its handler."""
        return _Handling(self.handlers.labels(self.service, kind))

    def error(self, code: str) -> None:
        """Count one failed request with error ``code``."""
        counter = self._codes.get(code)
        if counter is None:
            counter = self._codes[code] = self.errors.labels(self.service, code)
        counter.inc()

    def set_in_flight(self, value: int) -> None:
        self.in_flight.labels(self.service).set(value)

    def track_in_flight(self, read: Callable[[], float]) -> None:
        """Read the in-flight gauge from ``read()`` at scrape time (no per-request cost)."""
        self.in_flight.labels(self.service).set_function(read)

    def exposition(self, prefix: str = DEFAULT_PREFIX) -> bytes:
        """The registry in Prometheus text format, every name starting with ``prefix``."""
        return generate_latest(exposed(self.registry, prefix))


def exposed(registry: CollectorRegistry, prefix: str = DEFAULT_PREFIX) -> CollectorRegistry:
    """``registry`` as a scrape should see it: every metric name starting with ``prefix``
    instead of ``jetserve_`` (``registry`` itself for the default prefix)."""
    if prefix == DEFAULT_PREFIX:
        return registry
    view = CollectorRegistry()
    view.register(_Renamed(registry, prefix))
    return view


class _Renamed(Collector):
    """Another registry's families, renamed at each collection (``prefixed``)."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self._registry = registry
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        prefix = self._prefix
        for family in self._registry.collect():
            renamed = copy.copy(family)
            renamed.name = prefixed(family.name, prefix)
            renamed.samples = [s._replace(name=prefixed(s.name, prefix)) for s in family.samples]
            yield renamed


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it (``0.00025``, ``1.0``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


class _Handling:
    """The context manager ``ServiceMetrics.handling`` returns (one per use: handlers overlap)."""

    __slots__ = ("_started", "_stats")

    def __init__(self, stats: KindStats) -> None:
        self._stats = stats
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stats.observe(time.perf_counter() - self._started)


def serve_metrics(
    metrics: ServiceMetrics, port: int, host: str = "0.0.0.0", *, prefix: str = DEFAULT_PREFIX
) -> None:
    """Serve ``/metrics`` on ``port`` from a background thread (0 = do nothing), every name
    starting with ``prefix``."""
    if port:
        start_http_server(port, addr=host, registry=exposed(metrics.registry, prefix))
