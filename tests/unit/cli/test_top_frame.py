"""``jetserve top``'s frame from plain data: bus messages, worker cards, and ``/metrics`` text made
by the services' own instruments (``GatewayMetrics``, ``RouterMetrics``, ``WorkerMetrics``)."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from services.cli.top.events import BusEvents
from services.cli.top.frame import Frame, build_frame
from services.cli.top.stats import Scrape, parse
from services.cli.top.view import render
from services.gateway.core.metrics import GatewayMetrics
from services.router.metrics import RouterMetrics
from shared.messages import RequestPhase, RouteDecision, TokenBatch, WorkerCard, WorkerLoad
from shared.worker.metrics import WorkerMetrics
from shared.worker.records import EngineLoad, EngineStats

MODEL = "m"
CHAT = "/v1/chat/completions"


def _card(worker_id: str, kv_blocks: int = 100) -> WorkerCard:
    return WorkerCard(worker_id=worker_id, model=MODEL, kv_blocks=kv_blocks)


def _decision(router_id: str, worker_id: str, overlap: int, prompt: int) -> RouteDecision:
    return RouteDecision(
        request_id="r",
        router_id=router_id,
        worker_id=worker_id,
        model=MODEL,
        mode="kv",
        overlap_blocks=overlap,
        prompt_blocks=prompt,
    )


def _stream(events: BusEvents, request_id: str, worker_id: str, times: list[float]) -> None:
    """One request's batches of 2 tokens at ``times``, the first with 100 prompt tokens of
    which 60 were cached, the last finishing it."""
    for i, at in enumerate(times):
        batch = TokenBatch(
            request_id=request_id,
            token_ids=(1, 2),
            index=2 * i,
            prompt_tokens=100 if i == 0 else 0,
            cached_tokens=60 if i == 0 else 0,
            worker_id=worker_id,
            finish_reason="length" if i == len(times) - 1 else None,
        )
        events.on_tokens(batch, at)


def _frame(
    events: BusEvents, scrapes: dict[str, list[Scrape]] | None = None, **kw: object
) -> Frame:
    cards = {w: _card(w) for w in ("w1", "w2")}
    return build_frame(events, cards, scrapes or {}, now=10.0, started_at=0.0, window_s=2.0, **kw)


class TestWorkers:
    def test_load_comes_from_the_latest_worker_load(self) -> None:
        events = BusEvents()
        events.on_load(
            WorkerLoad(worker_id="w1", active=1, kv_used_blocks=5, kv_total_blocks=100), 8.0
        )
        events.on_load(
            WorkerLoad(worker_id="w1", active=3, waiting=2, kv_used_blocks=9, kv_total_blocks=100),
            9.0,
        )
        w1 = _frame(events).workers[0]
        assert (w1.running, w1.waiting, w1.kv_used, w1.kv_total) == (3, 2, 9, 100)

    def test_a_worker_without_load_shows_its_card_capacity_and_nothing_else(self) -> None:
        w2 = _frame(BusEvents()).workers[1]
        assert (w2.worker_id, w2.running, w2.kv_used, w2.kv_total) == ("w2", None, None, 100)

    def test_tokens_per_second_and_hit_rate_count_only_the_window(self) -> None:
        events = BusEvents()
        _stream(events, "old", "w1", [1.0, 1.5])  # before the window (8..10)
        _stream(events, "new", "w1", [8.5, 9.0, 9.5])
        w1 = _frame(events).workers[0]
        assert w1.tokens_per_s == pytest.approx(6 / 2)
        assert w1.hit_rate == pytest.approx(0.6)

    def test_finished_requests_per_second_come_from_lifecycle(self) -> None:
        events = BusEvents()
        for at in (8.5, 9.0, 9.9):
            events.on_phase(RequestPhase(request_id="r", worker_id="w2", phase="finished"), at)
        events.on_phase(RequestPhase(request_id="r", worker_id="w2", phase="prefill_done"), 9.0)
        assert _frame(events).workers[1].finished_per_s == pytest.approx(1.5)

    def test_the_workers_own_metrics_fill_in_for_a_quiet_worker(self) -> None:
        metrics = WorkerMetrics("mocker")
        metrics.observe("w2", EngineLoad(1, 4, 30, 100, 0), EngineStats(200, 50, 0))
        text = metrics.service.exposition().decode()
        scrapes = {"http://w/metrics": [Scrape("http://w/metrics", 9.0, parse(text))]}
        w2 = _frame(BusEvents(), scrapes).workers[1]
        assert (w2.running, w2.waiting, w2.kv_used) == (1, 4, 30)


class TestModels:
    def test_sum_their_workers_and_count_decisions_as_requests(self) -> None:
        events = BusEvents()
        events.on_load(
            WorkerLoad(worker_id="w1", active=2, kv_used_blocks=10, kv_total_blocks=100), 9.0
        )
        events.on_load(
            WorkerLoad(worker_id="w2", active=1, kv_used_blocks=20, kv_total_blocks=100), 9.0
        )
        for at in (8.5, 9.0, 9.5, 9.9):
            events.on_decision(_decision("r1", "w1", 0, 4), at)
        (model,) = _frame(events).models
        assert (model.workers, model.running, model.kv_used, model.kv_total) == (2, 3, 30, 200)
        assert model.requests_per_s == pytest.approx(2.0)


class TestRouters:
    def test_decisions_and_overlap_come_from_the_bus(self) -> None:
        events = BusEvents()
        events.on_decision(_decision("r1", "w1", overlap=2, prompt=4), 9.0)
        events.on_decision(_decision("r1", "w2", overlap=4, prompt=4), 9.5)
        (router,) = _frame(events).routers
        assert router.decisions_per_s == pytest.approx(1.0)
        assert router.mean_overlap_blocks == pytest.approx(3.0)
        assert router.overlap_share == pytest.approx(0.75)
        assert not router.has_metrics
        assert router.index_blocks is None

    def test_index_and_lag_come_from_the_routers_metrics_matched_by_id(self) -> None:
        metrics = RouterMetrics()
        metrics.identify("r1")
        metrics.index_blocks.set(42)
        metrics.event_lag.set(3)
        text = metrics.base.exposition().decode()
        events = BusEvents()
        events.on_decision(_decision("r1", "w1", 0, 1), 9.0)
        scrapes = {"http://r/metrics": [Scrape("http://r/metrics", 9.0, parse(text))]}
        (router,) = _frame(events, scrapes).routers
        assert (router.router_id, router.index_blocks, router.event_lag) == ("r1", 42, 3)


class TestGateway:
    def _scrapes(self) -> dict[str, list[Scrape]]:
        """A gateway's scrapes at 8 s and 10 s, with 4 inference requests between them."""
        metrics = GatewayMetrics()
        before = parse(metrics.exposition().decode())
        for ttft in (0.003, 0.004, 0.2):
            metrics.observe(CHAT, 200, 0.5, ttft_s=ttft)
        metrics.observe(CHAT, 503, 0.01, error="no_worker_available")
        metrics.observe("/metrics", 200, 0.001)
        after = parse(metrics.exposition().decode())
        url = "http://g/metrics"
        return {url: [Scrape(url, 8.0, before), Scrape(url, 10.0, after)]}

    def test_counts_inference_requests_not_scrapes(self) -> None:
        g = _frame(BusEvents(), self._scrapes()).gateway
        assert (g.requests_total, g.requests_per_s) == (4, 2.0)

    def test_ttft_percentiles_come_from_the_histogram_buckets(self) -> None:
        g = _frame(BusEvents(), self._scrapes()).gateway
        assert g.ttft_p50_s is not None
        assert 0.0025 < g.ttft_p50_s <= 0.005
        assert g.ttft_p99_s is not None
        assert 0.1 < g.ttft_p99_s <= 0.25

    def test_errors_by_code_and_by_status(self) -> None:
        g = _frame(BusEvents(), self._scrapes()).gateway
        assert g.errors == (("HTTP 503", 1, 1), ("no_worker_available", 1, 1))

    def test_itl_is_each_finished_requests_mean_gap_after_its_first_batch(self) -> None:
        events = BusEvents()
        _stream(events, "a", "w1", [8.0, 8.1, 8.3])  # 4 tokens after the first in 0.3 s
        _stream(events, "b", "w1", [9.0, 9.8])  # 2 tokens in 0.8 s
        g = _frame(events).gateway
        assert g.itl_p50_s == pytest.approx((0.075 + 0.4) / 2)

    def test_itl_comes_from_the_gateways_histogram_where_it_has_one(self) -> None:
        def itl(fast: int, slow: int) -> str:
            name = "jetserve_gateway_itl_seconds_bucket"
            rows = ((0.01, fast), (0.1, fast + slow), ("+Inf", fast + slow))
            return "# TYPE jetserve_gateway_itl_seconds histogram\n" + "".join(
                f'{name}{{endpoint="{CHAT}",le="{le}"}} {n}\n' for le, n in rows
            )

        url = "http://g/metrics"
        gateway = "# TYPE jetserve_http_requests counter\n"
        scrapes = {
            url: [
                Scrape(url, 8.0, parse(gateway + itl(5, 0))),
                Scrape(url, 10.0, parse(gateway + itl(6, 4))),
            ]
        }
        events = BusEvents()
        _stream(events, "a", "w1", [8.0, 9.0])  # a bus ITL of 0.5 s, not used
        g = _frame(events, scrapes).gateway
        assert g.itl_p50_s is not None
        assert 0.01 < g.itl_p50_s <= 0.1

    def test_without_a_gateway_endpoint_its_figures_are_unknown(self) -> None:
        g = _frame(BusEvents()).gateway
        assert (g.endpoints, g.requests_total, g.ttft_p50_s) == (0, None, None)


class TestView:
    def _text(self, frame: Frame) -> str:
        console = Console(width=160, color_system=None, record=True)
        console.print(render(frame, namespace="ns"))
        return console.export_text()

    def test_missing_sources_are_shown_as_na(self) -> None:
        events = BusEvents()
        events.on_decision(_decision("r1", "w1", 0, 1), 9.0)
        text = self._text(_frame(events))
        router_row = next(line for line in text.splitlines() if line.strip().startswith("r1"))
        assert router_row.split()[-4:] == ["n/a"] * 4

    def test_rows_split_on_runs_of_spaces_into_their_header_cells(self) -> None:
        text = self._text(_frame(BusEvents(), TestGateway()._scrapes()))
        lines = text.splitlines()
        header = next(i for i, line in enumerate(lines) if "gateways" in line)
        names = re.split(r"\s{2,}", lines[header].strip())
        cells = re.split(r"\s{2,}", lines[header + 2].strip())
        assert len(cells) == len(names)
        assert dict(zip(names, cells, strict=True))["requests"] == "4"

    def test_workers_show_their_role_and_data_parallel_ranks(self) -> None:
        cards = {
            "agg": WorkerCard(worker_id="agg", model=MODEL),
            "pre": WorkerCard(worker_id="pre", model=MODEL, role="prefill"),
            "dec": WorkerCard(worker_id="dec", model=MODEL, role="decode", dp_size=2),
        }
        events = BusEvents()
        events.on_load(WorkerLoad(worker_id="ghost", active=1), 9.0)  # load, but no card
        frame = build_frame(events, cards, {}, now=10.0, started_at=0.0, window_s=2.0)
        lines = self._text(frame).splitlines()
        header = next(i for i, line in enumerate(lines) if line.strip().startswith("worker "))
        names = re.split(r"\s{2,}", lines[header].strip())
        roles = {}
        for line in lines[header + 2 : header + 6]:
            cells = dict(zip(names, re.split(r"\s{2,}", line.strip()), strict=True))
            roles[cells["worker"]] = cells["role"]
        assert roles == {
            "agg": "both",
            "dec": "decode dp 2",
            "ghost (no card)": "-",
            "pre": "prefill",
        }
