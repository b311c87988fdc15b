"""The gateway's Prometheus instruments, beside the ones every service has.

HTTP requests by endpoint and status, request latency, time to first response and inter-token
latency per endpoint; gRPC requests by RPC and status code, and their latency; in-flight requests
are read from the bus at scrape time. Endpoint labels are a fixed set (the served routes, else
``other``; the gRPC inference RPCs' method paths), so unknown paths cannot grow the label space.
Admission (``--max-concurrent-requests``: requests counted, the limit, refusals) is read at
scrape time too.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.gateway.core.admission import Admission
from services.gateway.core.paths import Paths
from shared.metric_names import DEFAULT_PREFIX
from shared.metrics import ServiceMetrics

CONTENT_TYPE = CONTENT_TYPE_LATEST
ROUTES = Paths().all()
"""The endpoint labels at the default paths (the app passes the served ones)."""
GRPC_METHOD_PREFIX = "/inference.GRPCInferenceService/"
REQUEST_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


def endpoint_of(path: str, routes: frozenset[str] = ROUTES) -> str:
    """The endpoint label of a request path: the path when it is a route, else ``other``."""
    return path if path in routes else "other"


class GatewayMetrics:
    """Requests by endpoint and status, latency, TTFT, ITL; plus ``base`` (``ServiceMetrics``)."""

    def __init__(
        self,
        base: ServiceMetrics | None = None,
        *,
        routes: frozenset[str] = ROUTES,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self.base = base or ServiceMetrics("gateway")
        self._routes = routes
        self.prefix = prefix
        """What every exposed name starts with (``--metrics-prefix``; the instruments keep
        their ``jetserve_`` names in the code)."""
        registry = self.base.registry
        self.requests = Counter(
            "jetserve_http_requests_total",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "status"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "jetserve_http_request_seconds",
            "HTTP request latency, until the response is complete",
            ["endpoint"],
            buckets=REQUEST_BUCKETS_S,
            registry=registry,
        )
        self.ttft_seconds = Histogram(
            "jetserve_gateway_ttft_seconds",
            "Time from request to the first response chunk (first token when streaming)",
            ["endpoint"],
            buckets=REQUEST_BUCKETS_S,
            registry=registry,
        )
        self.itl_seconds = Histogram(
            "jetserve_gateway_itl_seconds",
            "Inter-token latency of one finished request: (latency - TTFT) / (completion "
            "tokens - 1), for requests with two tokens or more",
            ["endpoint"],
            buckets=ITL_BUCKETS_S,
            registry=registry,
        )
        self.grpc_requests = Counter(
            "jetserve_grpc_requests_total",
            "gRPC requests answered, by RPC and status code (each request on a "
            "ModelStreamInfer stream counts once)",
            ["rpc", "code"],
            registry=registry,
        )
        self.grpc_request_seconds = Histogram(
            "jetserve_grpc_request_seconds",
            "gRPC request latency, until the last response is sent",
            ["rpc"],
            buckets=REQUEST_BUCKETS_S,
            registry=registry,
        )
        self.replies = self.base.messages.labels(self.base.service, "reply")
        """Reply messages (ResponseChunk / RequestFailed) received from the bus."""
        self._by_status: dict[tuple[str, int], Counter] = {}
        self._latency: dict[str, Histogram] = {}
        self._ttft: dict[str, Histogram] = {}
        self._itl: dict[str, Histogram] = {}
        self._grpc_by_code: dict[tuple[str, str], Counter] = {}
        self._grpc_latency: dict[str, Histogram] = {}
        self._admission: _AdmissionCollector | None = None

    def track_admission(self, admission: Admission) -> None:
        """Expose ``admission`` (requests counted, limit, refusals), read at scrape time."""
        if self._admission is None:
            self._admission = _AdmissionCollector(admission)
            self.base.registry.register(self._admission)
        self._admission.admission = admission

    def observe(
        self,
        path: str,
        status: int,
        latency_s: float,
        ttft_s: float | None = None,
        error: str | None = None,
        completion_tokens: int = 0,
    ) -> None:
        """Record one finished HTTP request (label children are cached: about a microsecond)."""
        endpoint = endpoint_of(path, self._routes)
        counter = self._by_status.get((endpoint, status))
        if counter is None:
            counter = self._by_status[(endpoint, status)] = self.requests.labels(
                endpoint, str(status)
            )
        counter.inc()
        latency = self._latency.get(endpoint)
        if latency is None:
            latency = self._latency[endpoint] = self.request_seconds.labels(endpoint)
        latency.observe(latency_s)
        if ttft_s is not None:
            self._observe_tokens(endpoint, latency_s, ttft_s, completion_tokens)
        if error is not None:
            self.base.error(error)

    def observe_grpc(
        self,
        rpc: str,
        code: str,
        latency_s: float,
        ttft_s: float | None = None,
        error: str | None = None,
        completion_tokens: int = 0,
    ) -> None:
        """Record one finished gRPC request; its TTFT and ITL go beside HTTP's, under the RPC's
        method path (``/inference.GRPCInferenceService/ModelInfer``)."""
        counter = self._grpc_by_code.get((rpc, code))
        if counter is None:
            counter = self._grpc_by_code[(rpc, code)] = self.grpc_requests.labels(rpc, code)
        counter.inc()
        latency = self._grpc_latency.get(rpc)
        if latency is None:
            latency = self._grpc_latency[rpc] = self.grpc_request_seconds.labels(rpc)
        latency.observe(latency_s)
        if ttft_s is not None:
            self._observe_tokens(GRPC_METHOD_PREFIX + rpc, latency_s, ttft_s, completion_tokens)
        if error is not None:
            self.base.error(error)

    def _observe_tokens(
        self, endpoint: str, latency_s: float, ttft_s: float, completion_tokens: int
    ) -> None:
        """TTFT, and the mean time per token after the first when there are two or more."""
        ttft = self._ttft.get(endpoint)
        if ttft is None:
            ttft = self._ttft[endpoint] = self.ttft_seconds.labels(endpoint)
        ttft.observe(ttft_s)
        if completion_tokens > 1:
            itl = self._itl.get(endpoint)
            if itl is None:
                itl = self._itl[endpoint] = self.itl_seconds.labels(endpoint)
            itl.observe(max(0.0, latency_s - ttft_s) / (completion_tokens - 1))

    def exposition(self) -> bytes:
        return self.base.exposition(self.prefix)


class _AdmissionCollector(Collector):
    """``jetserve_gateway_concurrent_requests``, ``jetserve_gateway_max_concurrent_requests``
    and ``jetserve_gateway_rejected_total{reason}``, from the ``Admission`` at scrape time (no
    per-request cost)."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def collect(self) -> Iterator[Metric]:
        admission = self.admission
        yield GaugeMetricFamily(
            "jetserve_gateway_concurrent_requests",
            "Inference requests in flight (HTTP and gRPC), counted against "
            "--max-concurrent-requests",
            value=admission.in_flight,
        )
        yield GaugeMetricFamily(
            "jetserve_gateway_max_concurrent_requests",
            "The --max-concurrent-requests limit (0 = no limit)",
            value=admission.limit,
        )
        rejected = CounterMetricFamily(
            "jetserve_gateway_rejected",
            "Inference requests refused before any work was done, by reason (overloaded: over "
            "--max-concurrent-requests)",
            labels=["reason"],
        )
        rejected.add_metric(["overloaded"], admission.rejected)
        yield rejected
