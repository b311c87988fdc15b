"""How a ``jetserve top`` frame looks: rich tables for the gateway, models, workers and routers,
and, for a fleet that uses admission, its policy classes and tenants.

``render`` builds the renderable for the live screen and for ``--once`` (then printed without
colour). Cells are never empty and never hold two spaces in a row, so a script can split a row
on runs of two or more spaces. ``n/a``: no source for the figure was reached; ``-``: the source
said nothing in the window.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from services.cli.top.admission import TENANT_SPAN_S, AdmissionFigures
from services.cli.top.frame import Frame, ModelRow, RouterRow, WorkerRow
from services.cli.top.gateway import GatewayFigures

NA = "n/a"
NONE = "-"
LEGEND = (
    "n/a: not on the bus and no /metrics endpoint gives it "
    "(router figures: pass the router's /metrics with --metrics, or start `jetserve up` with "
    "--router-metrics-port).  -: nothing in the window.  ITL: the gateway's histogram where it "
    "has one, else each request's mean time between tokens after its first batch on the bus."
)


def render(frame: Frame, *, namespace: str) -> RenderableType:
    """The whole screen for ``frame``."""
    return Group(
        _header(frame, namespace),
        _gateway(frame.gateway),
        _models(frame.models),
        _workers(frame.workers),
        _routers(frame.routers),
        *_classes(frame.admission),
        *_tenants(frame.admission),
        *_problems(frame),
        Text(LEGEND, style="dim"),
    )


def _header(frame: Frame, namespace: str) -> Text:
    live = sum(1 for w in frame.workers if w.is_live)
    text = Text(f"jetserve top  namespace {namespace}", style="bold")
    text.append(
        f"   window {frame.span_s:.1f}s   workers {live}   routers {len(frame.routers)}   "
        f"/metrics endpoints {len(frame.endpoints)}   q quits"
    )
    return text


def _table(title: str, columns: Sequence[str]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, title_style="bold cyan")
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    return table


def _gateway(g: GatewayFigures) -> RenderableType:
    table = _table(
        "Gateway",
        ["gateways", "req/s", "requests", "in flight", "TTFT p50", "TTFT p99", "ITL p50",
         "ITL p99", "errors"],
    )  # fmt: skip
    has = g.endpoints > 0
    errors = ", ".join(f"{code} {_count(total)}" for code, _, total in g.errors) or "none"
    table.add_row(
        str(g.endpoints),
        _num(g.requests_per_s, has),
        _num(g.requests_total, has, digits=0),
        _num(g.in_flight, has, digits=0),
        _ms(g.ttft_p50_s, has),
        _ms(g.ttft_p99_s, has),
        _ms(g.itl_p50_s, True),
        _ms(g.itl_p99_s, True),
        errors if has else NA,
    )
    return table


LOAD_COLUMNS = ["running", "waiting", "KV blocks", "KV use", "cache hit", "tok/s"]


def _load(row: ModelRow | WorkerRow) -> list[str]:
    """The cells a model and a worker have alike (``LOAD_COLUMNS``)."""
    return [
        _num(row.running, True, digits=0),
        _num(row.waiting, True, digits=0),
        _blocks(row.kv_used, row.kv_total),
        _share(row.kv_used, row.kv_total),
        _pct(row.hit_rate),
        _num(row.tokens_per_s, True),
    ]


def _models(rows: Sequence[ModelRow]) -> RenderableType:
    table = _table("Models", ["model", "workers", *LOAD_COLUMNS, "req/s"])
    for m in rows:
        table.add_row(m.model, str(m.workers), *_load(m), _num(m.requests_per_s, True))
    return table


def _workers(rows: Sequence[WorkerRow]) -> RenderableType:
    table = _table("Workers", ["worker", "model", "role", *LOAD_COLUMNS, "done/s", "KV ev/s"])
    for w in rows:
        table.add_row(
            w.worker_id if w.is_live else f"{w.worker_id} (no card)",
            w.model or NONE,
            _role(w),
            *_load(w),
            _num(w.finished_per_s, True),
            _num(w.kv_events_per_s, True),
        )
    return table


def _role(w: WorkerRow) -> str:
    """``prefill``, ``decode`` or ``both``, with ``dp N`` for a worker of N > 1 data-parallel
    ranks (``decode dp 2``); ``-`` without a card."""
    if not w.role:
        return NONE
    return f"{w.role} dp {w.dp_size}" if w.dp_size > 1 else w.role


def _routers(rows: Sequence[RouterRow]) -> RenderableType:
    table = _table(
        "Routers",
        ["router", "decisions/s", "mean overlap", "overlap", "index blocks", "index nodes",
         "event lag", "event age"],
    )  # fmt: skip
    for r in rows:
        has = r.has_metrics
        table.add_row(
            r.router_id,
            _num(r.decisions_per_s, True),
            _num(r.mean_overlap_blocks, True),
            _pct(r.overlap_share),
            _num(r.index_blocks, has, digits=0),
            _num(r.index_nodes, has, digits=0),
            _num(r.event_lag, has, digits=0),
            _ms(r.event_age_s, has),
        )
    return table


def _classes(a: AdmissionFigures) -> list[RenderableType]:
    """The policy classes, under a caption with the router queue's depth (no table when no
    class was seen and nothing is queued)."""
    if not a.classes and not a.queue_depth:
        return []
    table = _table(
        "Classes",
        ["class", "req/s", "uncached tok/s", "share", "queued", "wait mean", "wait p50"],
    )
    for c in a.classes:
        table.add_row(
            c.policy_class or "(default)",
            _num(c.requests_per_s, True),
            _num(c.uncached_tokens_per_s, True),
            _pct(c.share),
            str(c.queued),
            _ms(c.wait_mean_s, True),
            _ms(c.wait_p50_s, True),
        )
    depth = _num(a.queue_depth, a.router_endpoints > 0, digits=0)
    table.caption = f"waiting in router queues: {depth}"
    table.caption_justify = "left"
    return [table]


def _tenants(a: AdmissionFigures) -> list[RenderableType]:
    if not a.tenants:
        return []
    table = _table("Tenants", ["tenant", "req/s", "tokens/min", "budget/min", "budget use", "429s"])
    has = a.router_endpoints > 0
    for t in a.tenants:
        table.add_row(
            t.tenant,
            _num(t.requests_per_s, True),
            _count(t.tokens),
            _num(t.budget, has, digits=0),
            _pct(t.budget_use) if has else NA,
            _num(t.refusals, has, digits=0),
        )
    if a.tenant_span_s < TENANT_SPAN_S:
        table.caption = f"tokens/min: over the {a.tenant_span_s:.0f}s top has run"
        table.caption_justify = "left"
    return [table]


def _problems(frame: Frame) -> list[Text]:
    return [Text(f"{e.url}: {e.error}", style="red") for e in frame.endpoints if e.error]


def _num(value: float | None, available: bool, *, digits: int = 1) -> str:
    if not available:
        return NA
    return NONE if value is None else f"{value:.{digits}f}"


def _count(value: float) -> str:
    return f"{value:.0f}"


def _ms(seconds: float | None, available: bool) -> str:
    if not available:
        return NA
    return NONE if seconds is None else f"{seconds * 1000:.1f}ms"


def _pct(share: float | None) -> str:
    return NONE if share is None else f"{share * 100:.0f}%"


def _blocks(used: float | None, total: float | None) -> str:
    return f"{_num(used, True, digits=0)}/{_num(total, True, digits=0)}"


def _share(used: float | None, total: float | None) -> str:
    return _pct(used / total) if used is not None and total else NONE
