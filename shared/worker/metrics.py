"""A worker process's Prometheus instruments: the shared ones plus per-worker engine gauges."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from shared.metrics import ServiceMetrics
from shared.worker.records import EngineLoad, EngineStats


class WorkerMetrics:
    """``ServiceMetrics(service)`` plus KV-cache and queue instruments labelled by worker, named
    ``jetserve_<service>_*`` (``jetserve_mocker_kv_blocks_used``, ...)."""

    def __init__(self, service: ServiceMetrics | str = "mocker") -> None:
        self.service = ServiceMetrics(service) if isinstance(service, str) else service
        p = f"jetserve_{self.service.service}"
        registry = self.service.registry
        labels = ["worker_id"]
        self.kv_blocks_used = Gauge(
            f"{p}_kv_blocks_used", "KV blocks in use", labels, registry=registry
        )
        self.kv_blocks_total = Gauge(
            f"{p}_kv_blocks_total", "KV blocks in all", labels, registry=registry
        )
        self.active_requests = Gauge(
            f"{p}_active_requests", "Requests running", labels, registry=registry
        )
        self.waiting_requests = Gauge(
            f"{p}_waiting_requests", "Requests waiting", labels, registry=registry
        )
        self.prompt_tokens = Counter(
            f"{p}_prompt_tokens", "Prompt tokens received", labels, registry=registry
        )
        self.cache_hit_tokens = Counter(
            f"{p}_prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache",
            labels,
            registry=registry,
        )
        self.preemptions = Counter(
            f"{p}_preemptions", "Requests preempted", labels, registry=registry
        )
        self.kv_event_batches = Counter(
            f"{p}_kv_event_batches",
            "KvEventBatch messages stored in JetStream",
            labels,
            registry=registry,
        )
        self.engine_healthy = Gauge(
            f"{p}_engine_healthy",
            "1 while the engine passes its health checks, 0 after a miss (decision 029)",
            labels,
            registry=registry,
        )
        self.engine_unhealthy = Counter(
            f"{p}_engine_unhealthy",
            "Times the engine was found unhealthy, by reason (canary_timeout, canary_failed, "
            "engine_stalled)",
            [*labels, "reason"],
            registry=registry,
        )
        self._seen: dict[str, EngineStats] = {}

    def observe(self, worker_id: str, load: EngineLoad, stats: EngineStats) -> None:
        """Set the gauges from ``load``; advance the counters by what ``stats`` gained."""
        self.kv_blocks_used.labels(worker_id).set(load.kv_used_blocks)
        self.kv_blocks_total.labels(worker_id).set(load.kv_total_blocks)
        self.active_requests.labels(worker_id).set(load.active)
        self.waiting_requests.labels(worker_id).set(load.waiting)
        seen = self._seen.setdefault(worker_id, EngineStats())
        self.prompt_tokens.labels(worker_id).inc(stats.prompt_tokens - seen.prompt_tokens)
        self.cache_hit_tokens.labels(worker_id).inc(stats.cache_hit_tokens - seen.cache_hit_tokens)
        self.preemptions.labels(worker_id).inc(stats.preemptions - seen.preemptions)
        seen.prompt_tokens = stats.prompt_tokens
        seen.cache_hit_tokens = stats.cache_hit_tokens
        seen.preemptions = stats.preemptions
