"""Prometheus metrics every service shares, and the ``/metrics`` endpoint of the bus services.

Each service builds one ``ServiceMetrics`` (its own registry, so tests can build many) and adds
its own instruments to ``metrics.registry``. ``serve_metrics(port)`` starts a small HTTP server
for bus services; the gateway serves ``/metrics`` from its own HTTP app instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


class ServiceMetrics:
    """The instruments every service has: messages handled, handler latency, errors, in flight."""

    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.service = service
        self.registry = registry or CollectorRegistry()
        self.messages = Counter(
            "jetserve_messages_total",
            "Bus messages handled, by kind",
            ["service", "kind"],
            registry=self.registry,
        )
        self.handler_seconds = Histogram(
            "jetserve_handler_seconds",
            "Time spent in a message handler",
            ["service", "kind"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
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

    @contextmanager
    def handling(self, kind: str) -> Iterator[None]:
        """Count one message of ``kind`` and time its handler."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.messages.labels(self.service, kind).inc()
            self.handler_seconds.labels(self.service, kind).observe(time.perf_counter() - started)

    def error(self, code: str) -> None:
        self.errors.labels(self.service, code).inc()

    def set_in_flight(self, value: int) -> None:
        self.in_flight.labels(self.service).set(value)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)


def serve_metrics(metrics: ServiceMetrics, port: int, host: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` on ``port`` from a background thread (0 = do nothing)."""
    if port:
        start_http_server(port, addr=host, registry=metrics.registry)
