"""One screen of ``jetserve top``: the fleet's figures over the last window, built from what the
bus showed (``BusEvents``), the live worker cards and the services' ``/metrics`` scrapes (the
gateway's figures are made in ``gateway``, admission's in ``admission``). Pure: ``now`` is passed
in.

A figure is ``None`` when nothing says it: the view shows ``n/a`` where no source for it was
reached (a router's index size without its ``/metrics``), ``-`` where the source said nothing in
the window (TTFT with no request finished).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.cli.top.admission import AdmissionFigures, admission_figures
from services.cli.top.events import BusEvents, WorkerSeen
from services.cli.top.gateway import GatewayFigures, gateway_figures, sum_known
from services.cli.top.stats import (
    Samples,
    Scrape,
    Window,
    window,
)
from shared.messages import WorkerCard


@dataclass(frozen=True, slots=True)
class WorkerRow:
    worker_id: str
    model: str
    """Empty when no card was seen (the worker sent load or tokens but is not registered)."""
    is_live: bool
    role: str
    """The card's role (``prefill``, ``decode``, ``both``); empty without a card."""
    dp_size: int
    """The card's data-parallel ranks (1 without a card)."""
    running: int | None
    waiting: int | None
    kv_used: int | None
    kv_total: int | None
    hit_rate: float | None
    """Prompt tokens served from the prefix cache / prompt tokens, of requests begun in the
    window."""
    tokens_per_s: float
    finished_per_s: float
    kv_events_per_s: float


@dataclass(frozen=True, slots=True)
class ModelRow:
    model: str
    workers: int
    running: float | None
    waiting: float | None
    kv_used: float | None
    kv_total: float | None
    hit_rate: float | None
    tokens_per_s: float
    requests_per_s: float
    """Routing decisions for the model per second."""


@dataclass(frozen=True, slots=True)
class RouterRow:
    router_id: str
    decisions_per_s: float
    mean_overlap_blocks: float | None
    overlap_share: float | None
    """Overlap blocks / prompt blocks of the window's decisions."""
    has_metrics: bool
    index_blocks: float | None = None
    index_nodes: float | None = None
    event_lag: float | None = None
    event_age_s: float | None = None


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    url: str
    service: str
    error: str


@dataclass(frozen=True, slots=True)
class Frame:
    span_s: float
    gateway: GatewayFigures
    models: tuple[ModelRow, ...]
    workers: tuple[WorkerRow, ...]
    routers: tuple[RouterRow, ...]
    endpoints: tuple[EndpointStatus, ...]
    admission: AdmissionFigures
    """Policy classes and tenants (empty for a fleet without admission)."""


def service_of(samples: Samples) -> str:
    """Which service a scrape came from, by the instruments it declares."""
    if "jetserve_http_requests" in samples.families:
        return "gateway"
    if "jetserve_router_decisions" in samples.families:
        return "router"
    if any(_is_worker_gauge(name) for name in samples.families):
        return "worker"
    services = {labels.get("service", "") for labels, _ in samples.select("jetserve_in_flight")}
    return next(iter(services), "") or "unknown"


def _is_worker_gauge(family: str) -> bool:
    return family.startswith("jetserve_") and family.endswith("_kv_blocks_used")


def build_frame(
    events: BusEvents,
    cards: Mapping[str, WorkerCard],
    scrapes: Mapping[str, Sequence[Scrape]],
    *,
    now: float,
    started_at: float,
    window_s: float,
) -> Frame:
    """The frame at ``now`` over the last ``window_s`` (less while ``top`` has run less)."""
    span = max(min(window_s, now - started_at), 1e-9)
    start = now - span
    windows = {url: w for url, h in scrapes.items() if (w := window(h, now, window_s))}
    by_service: dict[str, list[Window]] = {}
    for w in windows.values():
        by_service.setdefault(service_of(w.new.samples), []).append(w)
    workers = _workers(events, cards, by_service.get("worker", []), start, span)
    return Frame(
        span_s=span,
        gateway=gateway_figures(by_service.get("gateway", []), events.itl_since(start)),
        models=_models(workers, events, start, span),
        workers=workers,
        routers=_routers(events, by_service.get("router", []), start, span),
        endpoints=_endpoints(scrapes, windows),
        admission=admission_figures(
            events,
            by_service.get("router", []),
            now=now,
            started_at=started_at,
            start=start,
            span=span,
        ),
    )


def _endpoints(
    scrapes: Mapping[str, Sequence[Scrape]], windows: Mapping[str, Window]
) -> tuple[EndpointStatus, ...]:
    out = []
    for url, history in sorted(scrapes.items()):
        last = history[-1] if history else None
        service = service_of(windows[url].new.samples) if url in windows else ""
        error = last.error if last is not None else "not read yet"
        out.append(EndpointStatus(url, service, error))
    return tuple(out)


def _worker_gauges(windows: Sequence[Window]) -> dict[str, dict[str, float]]:
    """Per worker id, the worker ``/metrics`` gauges and counters (``kv_blocks_used``, ...)
    with their ``jetserve_<service>_`` prefix taken off, plus the window's ``*_delta``."""
    out: dict[str, dict[str, float]] = {}
    for w in windows:
        for (name, labels), value in w.new.samples.values.items():
            worker_id = dict(labels).get("worker_id")
            if worker_id is None or not name.startswith("jetserve_"):
                continue
            short = name.removeprefix("jetserve_").partition("_")[2]
            figures = out.setdefault(worker_id, {})
            figures[short] = value
            grown = w.delta(name, worker_id=worker_id)
            if grown is not None:
                figures[f"{short}_delta"] = grown
    return out


def _workers(
    events: BusEvents,
    cards: Mapping[str, WorkerCard],
    windows: Sequence[Window],
    start: float,
    span: float,
) -> tuple[WorkerRow, ...]:
    gauges = _worker_gauges(windows)
    ids = sorted(set(cards) | set(events.workers) | set(gauges))
    rows = []
    for worker_id in ids:
        card = cards.get(worker_id)
        seen = events.workers.get(worker_id) or WorkerSeen()
        rows.append(_worker(worker_id, card, seen, gauges.get(worker_id, {}), start, span))
    return tuple(rows)


def _worker(
    worker_id: str,
    card: WorkerCard | None,
    seen: WorkerSeen,
    gauges: Mapping[str, float],
    start: float,
    span: float,
) -> WorkerRow:
    """The bus's latest load wins; the worker's own ``/metrics`` fill in for a worker that has
    not changed (and so not published its load) since ``top`` started."""
    load = seen.load

    def figure(bus: int | None, gauge: str) -> int | None:
        if bus is not None:
            return bus
        return int(gauges[gauge]) if gauge in gauges else None

    kv_total = figure(load.kv_total_blocks if load else None, "kv_blocks_total")
    if kv_total is None and card is not None and card.kv_blocks:
        kv_total = card.kv_blocks
    prompt, _ = seen.prompt_tokens.since(start)
    cached, _ = seen.cached_tokens.since(start)
    hit_rate = cached / prompt if prompt else None
    if hit_rate is None and gauges.get("prompt_tokens_total_delta"):
        hit_rate = (
            gauges.get("prefix_cache_hit_tokens_total_delta", 0.0)
            / gauges["prompt_tokens_total_delta"]
        )
    return WorkerRow(
        worker_id=worker_id,
        model=card.model if card is not None else "",
        is_live=card is not None,
        role=card.role if card is not None else "",
        dp_size=card.dp_size if card is not None else 1,
        running=figure(load.active if load else None, "active_requests"),
        waiting=figure(load.waiting if load else None, "waiting_requests"),
        kv_used=figure(load.kv_used_blocks if load else None, "kv_blocks_used"),
        kv_total=kv_total,
        hit_rate=hit_rate,
        tokens_per_s=seen.tokens.since(start)[0] / span,
        finished_per_s=seen.finished.since(start)[1] / span,
        kv_events_per_s=seen.kv_events.since(start)[0] / span,
    )


def _models(
    workers: Sequence[WorkerRow], events: BusEvents, start: float, span: float
) -> tuple[ModelRow, ...]:
    by_model: dict[str, list[WorkerRow]] = {}
    for row in workers:
        if row.model:
            by_model.setdefault(row.model, []).append(row)
    for model in events.decisions_by_model:
        by_model.setdefault(model, [])
    rows = []
    for model, group in sorted(by_model.items()):
        prompt = cached = 0.0
        for row in group:
            seen = events.workers.get(row.worker_id)
            if seen is not None:
                prompt += seen.prompt_tokens.since(start)[0]
                cached += seen.cached_tokens.since(start)[0]
        decisions = events.decisions_by_model.get(model)
        rows.append(
            ModelRow(
                model=model,
                workers=sum(1 for row in group if row.is_live),
                running=sum_known([row.running for row in group]),
                waiting=sum_known([row.waiting for row in group]),
                kv_used=sum_known([row.kv_used for row in group]),
                kv_total=sum_known([row.kv_total for row in group]),
                hit_rate=cached / prompt if prompt else None,
                tokens_per_s=sum(row.tokens_per_s for row in group),
                requests_per_s=decisions.since(start)[1] / span if decisions else 0.0,
            )
        )
    return tuple(rows)


def _routers(
    events: BusEvents, windows: Sequence[Window], start: float, span: float
) -> tuple[RouterRow, ...]:
    scraped: dict[str, Samples] = {}
    for w in windows:
        info = w.new.samples.select("jetserve_router_info")
        ids = [labels.get("router_id", "") for labels, _ in info]
        scraped[ids[0] if ids and ids[0] else w.new.url] = w.new.samples
    rows = []
    for router_id in sorted(set(events.routers) | set(scraped)):
        seen = events.routers.get(router_id)
        decisions = seen.decisions.since(start)[1] if seen else 0
        overlap = seen.overlap_blocks.since(start)[0] if seen else 0.0
        prompt = seen.prompt_blocks.since(start)[0] if seen else 0.0
        samples = scraped.get(router_id)
        metrics = {}
        if samples is not None:
            metrics = {
                "index_blocks": samples.total("jetserve_router_index_blocks"),
                "index_nodes": samples.total("jetserve_router_index_nodes"),
                "event_lag": samples.total("jetserve_router_kv_event_lag_messages"),
                "event_age_s": samples.total("jetserve_router_kv_event_age_seconds"),
            }
        rows.append(
            RouterRow(
                router_id=router_id,
                decisions_per_s=decisions / span,
                mean_overlap_blocks=overlap / decisions if decisions else None,
                overlap_share=overlap / prompt if prompt else None,
                has_metrics=samples is not None,
                **metrics,
            )
        )
    return tuple(rows)
