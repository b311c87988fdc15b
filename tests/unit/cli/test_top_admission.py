"""``jetserve top``'s admission figures (issue 26) from plain data: routing decisions and finished
phases as the bus carries them, and router ``/metrics`` text made by ``RouterMetrics`` itself."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from services.cli.top.admission import AdmissionFigures
from services.cli.top.events import OPEN_REQUEST_TTL_S, BusEvents
from services.cli.top.frame import Frame, build_frame
from services.cli.top.stats import Samples, Scrape, parse
from services.cli.top.view import render
from services.router.metrics import RouterMetrics
from shared import codec
from shared.messages import RequestPhase, RouteDecision

NOW = 100.0
WINDOW_S = 2.0


def _decision(
    request_id: str = "r",
    *,
    policy_class: str = "",
    tenant: str = "",
    prefill: int = 0,
    prompt: int = 0,
    queued_ms: float = 0.0,
    router_id: str = "r1",
) -> RouteDecision:
    return RouteDecision(
        request_id=request_id,
        router_id=router_id,
        worker_id="w1",
        model="m",
        mode="kv",
        prefill_tokens=prefill,
        prompt_tokens=prompt,
        policy_class=policy_class,
        tenant=tenant,
        queued_ms=queued_ms,
    )


def _finished(request_id: str, output_tokens: int) -> RequestPhase:
    return RequestPhase(
        request_id=request_id, worker_id="w1", phase="finished", output_tokens=output_tokens
    )


def _frame(
    events: BusEvents, scrapes: dict[str, list[Scrape]] | None = None, *, started_at: float = 0.0
) -> Frame:
    return build_frame(events, {}, scrapes or {}, now=NOW, started_at=started_at, window_s=WINDOW_S)


def _admission(
    events: BusEvents, scrapes: dict[str, list[Scrape]] | None = None
) -> AdmissionFigures:
    return _frame(events, scrapes).admission


def _router_scrapes(*routers: tuple[Samples, Samples]) -> dict[str, list[Scrape]]:
    """Each router's scrapes at the window's start and at ``NOW``."""
    out = {}
    for i, (before, after) in enumerate(routers):
        url = f"http://r{i}/metrics"
        out[url] = [Scrape(url, NOW - WINDOW_S, before), Scrape(url, NOW, after)]
    return out


def _samples(metrics: RouterMetrics, prefix: str = "jetserve_") -> Samples:
    return parse(metrics.base.exposition(prefix).decode(), prefix)


class TestClasses:
    def test_uncached_tokens_per_second_and_share_count_only_the_window(self) -> None:
        events = BusEvents()
        events.on_decision(_decision(policy_class="premium", prefill=5000), NOW - 30)  # before
        events.on_decision(_decision(policy_class="premium", prefill=300), NOW - 1.5)
        events.on_decision(_decision(policy_class="premium", prefill=300), NOW - 1.0)
        events.on_decision(_decision(policy_class="regular", prefill=200), NOW - 0.5)
        premium, regular = _admission(events).classes
        assert (premium.policy_class, regular.policy_class) == ("premium", "regular")
        assert (premium.uncached_tokens_per_s, regular.uncached_tokens_per_s) == (300, 100)
        assert (premium.share, regular.share) == (pytest.approx(0.75), pytest.approx(0.25))
        assert (premium.requests_per_s, regular.requests_per_s) == (1.0, 0.5)

    def test_queued_decisions_give_the_count_mean_and_median_wait(self) -> None:
        events = BusEvents()
        for at, waited_ms in ((NOW - 1.8, 10.0), (NOW - 1.2, 20.0), (NOW - 0.3, 90.0)):
            events.on_decision(_decision(policy_class="regular", queued_ms=waited_ms), at)
        events.on_decision(_decision(policy_class="regular"), NOW - 0.2)  # routed at once
        events.on_decision(_decision(policy_class="regular", queued_ms=500.0), NOW - 20)
        (regular,) = _admission(events).classes
        assert regular.queued == 3
        assert regular.wait_mean_s == pytest.approx(0.040)
        assert regular.wait_p50_s == pytest.approx(0.020)

    def test_a_class_that_never_waited_shows_no_wait(self) -> None:
        events = BusEvents()
        events.on_decision(_decision(policy_class="premium", prefill=10), NOW - 1)
        (premium,) = _admission(events).classes
        assert (premium.queued, premium.wait_mean_s, premium.wait_p50_s) == (0, None, None)

    def test_the_default_class_is_listed_beside_named_ones(self) -> None:
        events = BusEvents()
        events.on_decision(_decision(prefill=100), NOW - 1)
        events.on_decision(_decision(policy_class="batch", prefill=300), NOW - 1)
        classes = _admission(events).classes
        assert [(c.policy_class, c.share) for c in classes] == [("", 0.25), ("batch", 0.75)]

    def test_without_classes_or_queueing_there_are_no_class_rows(self) -> None:
        events = BusEvents()
        events.on_decision(_decision(prefill=100), NOW - 1)
        assert _admission(events).classes == ()

    def test_queueing_in_the_default_class_is_worth_showing(self) -> None:
        events = BusEvents()
        events.on_decision(_decision(queued_ms=30.0), NOW - 1)
        (default,) = _admission(events).classes
        assert (default.policy_class, default.queued) == ("", 1)

    def test_default_class_queueing_a_minute_ago_is_no_longer_worth_showing(self) -> None:
        events = BusEvents()
        events.on_decision(_decision(queued_ms=30.0), NOW - 70)
        events.on_decision(_decision(), NOW - 30)
        events.expire(NOW)
        assert _admission(events).classes == ()

    def test_a_class_quiet_for_a_minute_is_forgotten(self) -> None:
        events = BusEvents()
        events.on_decision(_decision(policy_class="batch"), NOW - 61)
        events.expire(NOW)
        assert _admission(events).classes == ()


class TestTenants:
    def test_tokens_are_prompt_at_the_decision_plus_output_when_finished(self) -> None:
        events = BusEvents()
        events.on_decision(_decision("a", tenant="acme", prompt=400), NOW - 40)
        events.on_decision(_decision("b", tenant="acme", prompt=100), NOW - 1)
        events.on_phase(_finished("a", 64), NOW - 0.5)
        (acme,) = _admission(events).tenants
        assert acme.tokens == 564
        assert acme.requests_per_s == pytest.approx(0.5)

    def test_only_the_last_minute_counts(self) -> None:
        events = BusEvents()
        events.on_decision(_decision("old", tenant="acme", prompt=1000), NOW - 61)
        events.on_decision(_decision("new", tenant="acme", prompt=10), NOW - 59)
        (acme,) = _admission(events).tenants
        assert acme.tokens == 10

    def test_output_tokens_are_charged_once(self) -> None:
        events = BusEvents()
        events.on_decision(_decision("a", tenant="acme", prompt=10), NOW - 1)
        events.on_phase(_finished("a", 5), NOW - 0.9)
        events.on_phase(_finished("a", 5), NOW - 0.8)  # a second worker's, or redelivered
        events.on_phase(_finished("unknown", 7), NOW - 0.8)
        (acme,) = _admission(events).tenants
        assert acme.tokens == 15

    def test_a_request_without_a_tenant_charges_no_one(self) -> None:
        events = BusEvents()
        events.on_decision(_decision("a", prompt=10), NOW - 1)
        events.on_phase(_finished("a", 5), NOW - 0.5)
        assert _admission(events).tenants == ()

    def test_a_request_not_finished_within_the_ttl_is_forgotten(self) -> None:
        events = BusEvents()
        decided = NOW - OPEN_REQUEST_TTL_S - 1
        events.on_decision(_decision("lost", tenant="acme", prompt=10), decided)
        events.on_decision(_decision("live", tenant="acme", prompt=10), NOW - 1)
        events.expire(NOW)
        events.on_phase(_finished("lost", 1000), NOW - 0.5)
        events.on_phase(_finished("live", 3), NOW - 0.5)
        (acme,) = _admission(events).tenants
        assert acme.tokens == 13

    def test_a_tenant_quiet_for_a_minute_is_forgotten(self) -> None:
        events = BusEvents()
        events.on_decision(_decision("a", tenant="acme", prompt=10), NOW - 61)
        events.expire(NOW)
        assert _admission(events).tenants == ()

    def test_budget_use_and_429s_come_from_the_routers_metrics(self) -> None:
        metrics = RouterMetrics()
        metrics.tenant_budget.labels("small").set(400)
        metrics.tenant_tokens.labels("small").set(300)
        metrics.budget_refusals.labels("small").inc(2)
        before = _samples(metrics)
        metrics.budget_refusals.labels("small").inc(3)
        after = _samples(metrics)
        events = BusEvents()
        events.on_decision(_decision("a", tenant="small", prompt=10), NOW - 1)
        (small,) = _admission(events, _router_scrapes((before, after))).tenants
        assert (small.budget, small.budget_use, small.refusals) == (400, 0.75, 3)

    def test_refusals_sum_over_routers_and_budgets_do_not(self) -> None:
        one, two = RouterMetrics(), RouterMetrics()
        for m in (one, two):
            m.tenant_budget.labels("small").set(400)
        before = (_samples(one), _samples(two))
        one.budget_refusals.labels("small").inc(1)
        two.budget_refusals.labels("small").inc(4)
        scrapes = _router_scrapes((before[0], _samples(one)), (before[1], _samples(two)))
        (small,) = _admission(BusEvents(), scrapes).tenants
        assert (small.tenant, small.budget, small.refusals, small.tokens) == ("small", 400, 5, 0)

    def test_a_prefixed_scrape_reads_the_same(self) -> None:
        metrics = RouterMetrics()
        metrics.tenant_budget.labels("small").set(400)
        metrics.queue_depth.set(2)
        prefixed = _samples(metrics, "acme_")
        figures = _admission(BusEvents(), _router_scrapes((prefixed, prefixed)))
        assert (figures.tenants[0].budget, figures.queue_depth) == (400, 2)

    def test_without_router_metrics_budgets_and_429s_are_unknown(self) -> None:
        events = BusEvents()
        events.on_decision(_decision("a", tenant="acme", prompt=10), NOW - 1)
        figures = _admission(events)
        (acme,) = figures.tenants
        assert (figures.router_endpoints, acme.budget, acme.refusals) == (0, None, None)

    def test_tokens_cover_only_what_top_has_seen(self) -> None:
        figures = _frame(BusEvents(), started_at=NOW - 12).admission
        assert figures.tenant_span_s == 12


class TestQueueDepth:
    def test_is_summed_over_routers(self) -> None:
        one, two = RouterMetrics(), RouterMetrics()
        one.queue_depth.set(2)
        two.queue_depth.set(5)
        scrapes = _router_scrapes((_samples(one), _samples(one)), (_samples(two), _samples(two)))
        assert _admission(BusEvents(), scrapes).queue_depth == 7


class TestEncodedMessages:
    def test_figures_from_messages_as_the_bus_carries_them(self) -> None:
        """Decoded as the feed decodes them: one decoder per subscription's type."""
        events = BusEvents()
        decode_decision = codec.decoder(RouteDecision).decode
        decode_phase = codec.decoder(RequestPhase).decode
        wire = codec.encode(
            _decision("a", policy_class="premium", tenant="acme", prefill=30, prompt=50)
        )
        events.on_decision(decode_decision(wire), NOW - 1)
        events.on_phase(decode_phase(codec.encode(_finished("a", 7))), NOW - 0.5)
        figures = _admission(events)
        assert (figures.classes[0].uncached_tokens_per_s, figures.tenants[0].tokens) == (15, 57)


class TestView:
    def _text(self, frame: Frame) -> str:
        console = Console(width=160, color_system=None, record=True)
        console.print(render(frame, namespace="ns"))
        return console.export_text()

    def _table(self, text: str, title: str) -> list[dict[str, str]]:
        lines = text.splitlines()
        start = lines.index(next(line for line in lines if line.strip() == title))
        names = re.split(r"\s{2,}", lines[start + 2].strip())
        rows = []
        for line in lines[start + 4 :]:
            if not line.strip():
                break
            rows.append(dict(zip(names, re.split(r"\s{2,}", line.strip()), strict=True)))
        return rows

    def test_a_fleet_without_admission_shows_no_admission_tables(self) -> None:
        events = BusEvents()
        events.on_decision(_decision(prefill=100, prompt=100), NOW - 1)
        text = self._text(_frame(events))
        assert "Classes" not in text
        assert "Tenants" not in text

    def test_classes_rows_and_the_queue_depth(self) -> None:
        metrics = RouterMetrics()
        metrics.queue_depth.set(3)
        events = BusEvents()
        events.on_decision(_decision(prefill=100), NOW - 1)
        events.on_decision(_decision(policy_class="batch", prefill=300, queued_ms=25), NOW - 1)
        text = self._text(_frame(events, _router_scrapes((_samples(metrics),) * 2)))
        rows = self._table(text, "Classes")
        assert [(r["class"], r["share"], r["queued"], r["wait p50"]) for r in rows] == [
            ("(default)", "25%", "0", "-"),
            ("batch", "75%", "1", "25.0ms"),
        ]
        assert "waiting in router queues: 3" in text

    def test_tenants_rows_show_na_without_router_metrics(self) -> None:
        events = BusEvents()
        events.on_decision(_decision("a", tenant="acme", prompt=100), NOW - 1)
        events.on_phase(_finished("a", 20), NOW - 0.5)
        (acme,) = self._table(self._text(_frame(events)), "Tenants")
        assert acme == {
            "tenant": "acme",
            "req/s": "0.5",
            "tokens/min": "120",
            "budget/min": "n/a",
            "budget use": "n/a",
            "429s": "n/a",
        }
