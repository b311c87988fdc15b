"""Admission in a ``jetserve top`` frame (issue 26): per policy class and per tenant, from the
bus (``RouteDecision``, ``RequestPhase``), and the tenants' budgets, 429s and the router queue's
depth from the routers' ``/metrics``. Pure: times are passed in.

Nothing here is shown for a fleet that does not use admission: no class rows unless a decision
named a class or waited in a router queue, no tenant rows unless a decision named a tenant or a
router reports a tenant's budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.cli.top.events import KEEP_S, BusEvents
from services.cli.top.stats import Window, quantile

TENANT_SPAN_S = 60.0
"""Budgets are tokens per rolling minute: a tenant's tokens are summed over this long."""
QUEUE_DEPTH = "jetserve_router_queue_depth"
TENANT_BUDGET = "jetserve_router_tenant_budget_tokens_per_minute"
TENANT_TOKENS = "jetserve_router_tenant_tokens_last_minute"
BUDGET_REFUSALS = "jetserve_router_budget_refusals_total"


@dataclass(frozen=True, slots=True)
class ClassRow:
    policy_class: str
    """Empty: the routers' default class (the decision named none)."""
    requests_per_s: float
    uncached_tokens_per_s: float
    """Uncached prompt tokens routed per second (``prefill_tokens``: what fair shares count)."""
    share: float | None
    """Of every class's uncached prompt tokens in the window."""
    queued: int
    """Decisions in the window that waited in a router queue."""
    wait_mean_s: float | None
    wait_p50_s: float | None


@dataclass(frozen=True, slots=True)
class TenantRow:
    tenant: str
    requests_per_s: float
    tokens: float
    """Prompt + output tokens over the last ``TENANT_SPAN_S`` (less while ``top`` has run less),
    as the bus showed them."""
    budget: float | None = None
    """Tokens per minute (``None``: no router reported one)."""
    budget_use: float | None = None
    """The routers' own count of the tenant's last minute / its budget."""
    refusals: float | None = None
    """Requests refused with 429 in the window, summed over routers (``None``: not two scrapes)."""


@dataclass(frozen=True, slots=True)
class AdmissionFigures:
    classes: tuple[ClassRow, ...] = ()
    tenants: tuple[TenantRow, ...] = ()
    router_endpoints: int = 0
    """Router ``/metrics`` endpoints read (0: budgets, 429s and the queue depth are n/a)."""
    queue_depth: float | None = None
    """Requests waiting in router queues, summed over the routers read."""
    tenant_span_s: float = TENANT_SPAN_S


def admission_figures(
    events: BusEvents,
    routers: Sequence[Window],
    *,
    now: float,
    started_at: float,
    start: float,
    span: float,
) -> AdmissionFigures:
    """Classes over the window ``start`` .. ``start + span``; tenants' tokens over the last
    minute; budgets, 429s and the queue depth from the routers' scrapes (``routers``)."""
    depths = [d for w in routers if (d := w.new.samples.total(QUEUE_DEPTH)) is not None]
    return AdmissionFigures(
        classes=_classes(events, start, span),
        tenants=_tenants(events, routers, now, start, span),
        router_endpoints=len(routers),
        queue_depth=sum(depths) if depths else None,
        tenant_span_s=max(min(TENANT_SPAN_S, now - started_at), 0.0),
    )


def _classes(events: BusEvents, start: float, span: float) -> tuple[ClassRow, ...]:
    seen = events.classes
    if not any(name or c.waits for name, c in seen.items()):
        return ()
    served = {name: c.uncached_tokens.since(start)[0] for name, c in seen.items()}
    total = sum(served.values())
    rows = []
    for name, c in sorted(seen.items()):
        waits = [s for at, s in c.waits if at >= start]
        rows.append(
            ClassRow(
                policy_class=name,
                requests_per_s=c.decisions.since(start)[1] / span,
                uncached_tokens_per_s=served[name] / span,
                share=served[name] / total if total else None,
                queued=len(waits),
                wait_mean_s=sum(waits) / len(waits) if waits else None,
                wait_p50_s=quantile(0.5, waits),
            )
        )
    return tuple(rows)


def _tenants(
    events: BusEvents, routers: Sequence[Window], now: float, start: float, span: float
) -> tuple[TenantRow, ...]:
    budgets = _max_by_tenant(w.new.samples.by_label(TENANT_BUDGET, "tenant") for w in routers)
    counted = _max_by_tenant(w.new.samples.by_label(TENANT_TOKENS, "tenant") for w in routers)
    rows = []
    for name in sorted(set(events.tenants) | set(budgets)):
        seen = events.tenants.get(name)
        budget = budgets.get(name)
        used = counted.get(name)
        rows.append(
            TenantRow(
                tenant=name,
                requests_per_s=seen.requests.since(start)[1] / span if seen else 0.0,
                tokens=seen.tokens.since(now - min(TENANT_SPAN_S, KEEP_S))[0] if seen else 0.0,
                budget=budget,
                budget_use=(used or 0.0) / budget if budget else None,
                refusals=_refusals(routers, name),
            )
        )
    return tuple(rows)


def _max_by_tenant(per_router: Iterable[dict[str, float]]) -> dict[str, float]:
    """Every replica reads the same policy and counts every replica's decisions: the largest
    figure is the freshest, not a part of a sum."""
    out: dict[str, float] = {}
    for figures in per_router:
        for tenant, value in figures.items():
            out[tenant] = max(out.get(tenant, value), value)
    return out


def _refusals(routers: Sequence[Window], tenant: str) -> float | None:
    """The tenant's 429s in the window, summed over routers (each counts its own); a router
    that has refused none has no sample for the tenant: 0."""
    grown = [
        w.growth(lambda samples: samples.total(BUDGET_REFUSALS, tenant=tenant) or 0.0)
        for w in routers
    ]
    known = [g for g in grown if g is not None]
    return sum(known) if known else None
