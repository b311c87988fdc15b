"""``ServiceMetrics``: what every service exposes, in valid Prometheus text."""

from __future__ import annotations

from prometheus_client import Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shared.metrics import ServiceMetrics, exposed


def _samples(metrics: ServiceMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_handling_counts_messages_and_times_them() -> None:
    metrics = ServiceMetrics("svc")
    for _ in range(3):
        with metrics.handling("stream"):
            pass
    samples = _samples(metrics)
    labels = (("kind", "stream"), ("service", "svc"))
    assert samples[("jetserve_messages_total", labels)] == 3
    assert samples[("jetserve_handler_seconds_count", labels)] == 3
    assert (
        samples[("jetserve_handler_seconds_bucket", (*labels[:1], ("le", "+Inf"), labels[1]))] == 3
    )


def test_a_failing_handler_is_still_counted() -> None:
    metrics = ServiceMetrics("svc")
    try:
        with metrics.handling("x"):
            raise RuntimeError
    except RuntimeError:
        pass
    assert _samples(metrics)[("jetserve_messages_total", (("kind", "x"), ("service", "svc")))] == 1


def test_untimed_messages_count_without_a_histogram() -> None:
    metrics = ServiceMetrics("gw")
    metrics.messages.labels("gw", "reply").inc()
    samples = _samples(metrics)
    assert samples[("jetserve_messages_total", (("kind", "reply"), ("service", "gw")))] == 1
    assert not any(name.startswith("jetserve_handler_seconds") for name, _ in samples)


def test_histogram_buckets_are_cumulative() -> None:
    metrics = ServiceMetrics("svc")
    stats = metrics.handler_seconds.labels("svc", "k")
    for seconds in (0.00005, 0.0001, 0.003, 10.0):
        stats.observe(seconds)
    samples = _samples(metrics)

    def bucket(le: str) -> float:
        return samples[
            ("jetserve_handler_seconds_bucket", (("kind", "k"), ("le", le), ("service", "svc")))
        ]

    assert (bucket("0.0001"), bucket("0.005"), bucket("2.5"), bucket("+Inf")) == (2, 3, 3, 4)
    assert samples[("jetserve_handler_seconds_sum", (("kind", "k"), ("service", "svc")))] > 10


def test_errors_by_code_and_in_flight_read_at_scrape_time() -> None:
    metrics = ServiceMetrics("svc")
    held = [1, 2]
    metrics.track_in_flight(lambda: len(held))
    metrics.error("timeout")
    metrics.error("timeout")
    held.append(3)
    samples = _samples(metrics)
    assert samples[("jetserve_errors_total", (("code", "timeout"), ("service", "svc")))] == 2
    assert samples[("jetserve_in_flight", (("service", "svc"),))] == 3


def test_a_prefix_renames_every_family_and_sample_at_exposition() -> None:
    metrics = ServiceMetrics("svc")
    with metrics.handling("k"):
        pass
    metrics.error("timeout")
    Gauge("jetserve_router_index_blocks", "Blocks", registry=metrics.registry).set(7)
    text = metrics.exposition("acme_").decode()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert families == {
        "acme_messages",
        "acme_handler_seconds",
        "acme_errors",
        "acme_errors_created",
        "acme_in_flight",
        "acme_router_index_blocks",
    }
    assert "jetserve_" not in text
    assert "acme_router_index_blocks 7.0" in text.splitlines()


def test_the_default_prefix_exposes_the_registry_as_it_is() -> None:
    metrics = ServiceMetrics("svc")
    metrics.error("x")
    assert (
        metrics.exposition() == metrics.exposition("jetserve_") == generate_latest(metrics.registry)
    )
    assert exposed(metrics.registry) is metrics.registry
