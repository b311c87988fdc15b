"""The gateway's figures in a ``jetserve top`` frame, from its ``/metrics``: inference requests
(HTTP and gRPC) and their rate, in flight, TTFT percentiles from the histogram's buckets, errors
by code and by HTTP status; ITL from its histogram where it has one, else from the bus. Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from services.cli.top.stats import Samples, Window, histogram_quantile, quantile

NOT_INFERENCE = frozenset({"/metrics", "/health", "/live", "/v1/models"})
"""Gateway endpoints that are not inference requests (``top``'s own scrapes hit ``/metrics``)."""
GRPC_INFER_RPCS = frozenset({"ModelInfer", "ModelStreamInfer"})
TTFT = "jetserve_gateway_ttft_seconds"
ITL = "jetserve_gateway_itl_seconds"
"""Per-request inter-token latency, where the gateway has it; else ITL is measured on the bus."""


@dataclass(frozen=True, slots=True)
class GatewayFigures:
    endpoints: int
    """Gateway ``/metrics`` endpoints read (0: every gateway figure but ITL is n/a)."""
    requests_total: float | None = None
    requests_per_s: float | None = None
    in_flight: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    errors: tuple[tuple[str, float | None, float], ...] = ()
    """``(code, in the window, in all)``: error codes, then HTTP statuses >= 400."""


def _inference_requests(samples: Samples) -> float | None:
    """Inference requests answered (HTTP and gRPC), whatever their status (0 before any)."""
    http = samples.by_label("jetserve_http_requests_total", "endpoint")
    grpc = samples.by_label("jetserve_grpc_requests_total", "rpc")
    found = [n for e, n in http.items() if e not in NOT_INFERENCE]
    found += [n for rpc, n in grpc.items() if rpc in GRPC_INFER_RPCS]
    return sum(found)


def gateway_figures(windows: Sequence[Window], itl: Sequence[float]) -> GatewayFigures:
    """The gateways' figures, summed over their scrapes. ITL comes from the gateways'
    histogram when they have one, else from the bus (``itl``: each request's mean gap)."""
    itl_p50, itl_p99 = quantile(0.5, itl), quantile(0.99, itl)
    if not windows:
        return GatewayFigures(endpoints=0, itl_p50_s=itl_p50, itl_p99_s=itl_p99)
    totals = [_inference_requests(w.new.samples) for w in windows]
    rates = [w.per_s(w.growth(_inference_requests)) for w in windows]
    ttft = _buckets_gained(windows, TTFT)
    if any(ITL in w.new.samples.families for w in windows):
        itl_buckets = _buckets_gained(windows, ITL)
        itl_p50, itl_p99 = (
            histogram_quantile(0.5, itl_buckets),
            histogram_quantile(0.99, itl_buckets),
        )
    in_flight = [_gateway_in_flight(w.new.samples) for w in windows]
    return GatewayFigures(
        endpoints=len(windows),
        requests_total=sum_known(totals) or 0.0,
        requests_per_s=sum_known(rates),
        in_flight=sum_known(in_flight) or 0.0,
        ttft_p50_s=histogram_quantile(0.5, ttft),
        ttft_p99_s=histogram_quantile(0.99, ttft),
        itl_p50_s=itl_p50,
        itl_p99_s=itl_p99,
        errors=_errors(windows),
    )


def _buckets_gained(windows: Sequence[Window], histogram: str) -> dict[float, float]:
    """A histogram's buckets gained in the window, summed over the gateways."""
    gained: dict[float, float] = {}
    for w in windows:
        for bound, n in w.bucket_delta(histogram).items():
            gained[bound] = gained.get(bound, 0.0) + n
    return gained


def _gateway_in_flight(samples: Samples) -> float | None:
    """Inference requests in flight (admission's count; an older gateway: its bus count)."""
    admitted = samples.total("jetserve_gateway_concurrent_requests")
    return (
        admitted if admitted is not None else samples.total("jetserve_in_flight", service="gateway")
    )


def _errors(windows: Sequence[Window]) -> tuple[tuple[str, float | None, float], ...]:
    """Error codes, then HTTP statuses >= 400: in the window and in all, summed over gateways."""
    rows: dict[str, tuple[float | None, float]] = {}

    def add(key: str, recent: float | None, total: float) -> None:
        before_recent, before_total = rows.get(key, (None, 0.0))
        rows[key] = (sum_known([before_recent, recent]), before_total + total)

    for w in windows:
        codes = w.new.samples.by_label("jetserve_errors_total", "code", service="gateway")
        for code, total in codes.items():
            add(code, w.delta("jetserve_errors_total", service="gateway", code=code), total)
        for status, total in _failed_by_status(w.new.samples).items():
            recent = w.growth(functools.partial(_failed_with, status))
            add(f"HTTP {status}", recent, total)
    return tuple((key, recent, total) for key, (recent, total) in sorted(rows.items()))


def _failed_with(status: str, samples: Samples) -> float | None:
    return _failed_by_status(samples).get(status)


def _failed_by_status(samples: Samples) -> dict[str, float]:
    """Inference requests answered with a status >= 400, by status."""
    out: dict[str, float] = {}
    for labels, value in samples.select("jetserve_http_requests_total"):
        status = labels.get("status", "")
        if labels.get("endpoint") in NOT_INFERENCE or not status.isdigit() or int(status) < 400:
            continue
        out[status] = out.get(status, 0.0) + value
    return out


def sum_known(values: Sequence[float | int | None]) -> float | None:
    """The sum of the known values; ``None`` when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None
