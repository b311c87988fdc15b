"""The router's Prometheus instruments, beside the ones every service has."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from shared.metrics import ServiceMetrics

OVERLAP_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class RouterMetrics:
    """Decisions by mode, overlap, index size, KV event flow and lag, the replica's id."""

    def __init__(self, base: ServiceMetrics | None = None) -> None:
        self.base = base or ServiceMetrics("router")
        registry = self.base.registry
        self.decisions = Counter(
            "jetserve_router_decisions_total",
            "Routing decisions made by this replica, by mode",
            ["mode"],
            registry=registry,
        )
        self.overlap_blocks = Histogram(
            "jetserve_router_overlap_blocks",
            "Cached prefix blocks on the chosen worker, per decision",
            buckets=OVERLAP_BUCKETS,
            registry=registry,
        )
        self.index_blocks = Gauge(
            "jetserve_router_index_blocks",
            "(worker, block) pairs in the KV index",
            registry=registry,
        )
        self.index_nodes = Gauge(
            "jetserve_router_index_nodes",
            "Distinct blocks in the KV index",
            registry=registry,
        )
        self.kv_events = Counter(
            "jetserve_router_kv_event_batches_total",
            "KV event batches consumed, by outcome (applied, duplicate, gap, held)",
            ["outcome"],
            registry=registry,
        )
        self.event_lag = Gauge(
            "jetserve_router_kv_event_lag_messages",
            "KV event stream messages not yet consumed",
            registry=registry,
        )
        self.event_age = Gauge(
            "jetserve_router_kv_event_age_seconds",
            "Age of the last KV event batch consumed (now - its worker timestamp)",
            registry=registry,
        )
        self.dumps = Counter(
            "jetserve_router_kv_dumps_total",
            "Full KV dumps requested from workers, by result",
            ["result"],
            registry=registry,
        )
        self.active_requests = Gauge(
            "jetserve_router_active_requests",
            "Requests in flight as this replica accounts them (all replicas' decisions)",
            registry=registry,
        )
        self.queue_depth = Gauge(
            "jetserve_router_queue_depth",
            "Requests waiting in this replica's router queue",
            registry=registry,
        )
        self.queue_outcomes = Counter(
            "jetserve_router_queue_requests_total",
            "Router queue events, by outcome (queued, routed, full, expired, cancelled)",
            ["outcome"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "jetserve_router_queue_wait_seconds",
            "How long a queued request waited before it was routed",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.served_tokens = Counter(
            "jetserve_router_served_uncached_tokens_total",
            "Uncached prompt tokens this replica routed, by policy class (the fair shares' unit)",
            ["policy_class"],
            registry=registry,
        )
        self.tenant_tokens = Gauge(
            "jetserve_router_tenant_tokens_last_minute",
            "Prompt + output tokens each tenant with a budget spent in the last minute, "
            "fleet-wide, as this replica counts them",
            ["tenant"],
            registry=registry,
        )
        self.tenant_budget = Gauge(
            "jetserve_router_tenant_budget_tokens_per_minute",
            "Each tenant's token budget (--admission-config)",
            ["tenant"],
            registry=registry,
        )
        self.budget_refusals = Counter(
            "jetserve_router_budget_refusals_total",
            "Requests refused with 429 because their tenant spent its tokens per minute",
            ["tenant"],
            registry=registry,
        )
        self.session_bindings = Counter(
            "jetserve_router_session_bindings_total",
            "Session affinity (--session-affinity-ttl-s), by event: hit (a turn went to its "
            "bound worker), created, moved (dead or, soft, busy worker), refreshed (TTL "
            "restarted), adopted (another replica's concurrent write won)",
            ["event"],
            registry=registry,
        )
        self.unheard_ends = Counter(
            "jetserve_router_unheard_ends_total",
            "Requests this replica stopped counting without hearing that they ended, by how: "
            "load_report (the worker's own count left them out), ttl (--request-ttl-s passed)",
            ["how"],
            registry=registry,
        )
        self.workers_lost = Counter(
            "jetserve_router_workers_lost_total",
            "Workers this replica found lost, by reason (no_responders, unresponsive)",
            ["reason"],
            registry=registry,
        )
        self.disagg = Counter(
            "jetserve_router_disagg_requests_total",
            "Requests of disaggregated models by path: remote (prefill on a prefill worker), "
            "local (conditional disaggregation kept it on the decode worker), fallback (no "
            "live prefill worker: aggregated on a decode worker)",
            ["path"],
            registry=registry,
        )
        self.prefill_retries = Counter(
            "jetserve_router_prefill_retries_total",
            "Prefill phases sent again to another prefill worker, by reason (lost, bounced, "
            "timeout, or the prefill worker's error code)",
            ["reason"],
            registry=registry,
        )
        self.queries = Counter(
            "jetserve_router_query_only_total",
            "Query-only requests answered (nvext.annotations query_instance_id)",
            registry=registry,
        )
        self.snapshots = Counter(
            "jetserve_router_snapshots_total",
            "Index snapshots written by this replica",
            registry=registry,
        )
        self.info = Gauge(
            "jetserve_router_info",
            "This replica's router id (the one its RouteDecisions carry), value 1",
            ["router_id"],
            registry=registry,
        )

    def identify(self, router_id: str) -> None:
        """Label this registry with the replica's id, so a scrape can be matched to the
        replica's decisions on the bus (``jetserve top``)."""
        self.info.labels(router_id).set(1)
