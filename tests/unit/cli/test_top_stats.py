"""``jetserve top``'s arithmetic: Prometheus text, windows between scrapes, quantiles, tallies."""

from __future__ import annotations

import pytest

from services.cli.top.stats import Scrape, Tally, histogram_quantile, parse, quantile, window

TEXT = """\
# HELP jetserve_http_requests_total HTTP requests
# TYPE jetserve_http_requests_total counter
jetserve_http_requests_total{endpoint="/v1/chat/completions",status="200"} 7.0
jetserve_http_requests_total{endpoint="/v1/completions",status="200"} 3.0
jetserve_http_requests_total{endpoint="/v1/chat/completions",status="400"} 1.0
# HELP jetserve_errors_total Requests failed
# TYPE jetserve_errors_total counter
"""


def _counter(value: float) -> str:
    return f'# TYPE c_total counter\nc_total{{k="a"}} {value}\n'


class TestSamples:
    def test_sums_the_samples_whose_labels_match(self) -> None:
        samples = parse(TEXT)
        assert samples.total("jetserve_http_requests_total") == 11
        assert samples.total("jetserve_http_requests_total", status="200") == 10

    def test_a_family_without_samples_is_declared_but_has_no_total(self) -> None:
        samples = parse(TEXT)
        assert "jetserve_errors" in samples.families
        assert samples.total("jetserve_errors_total") is None

    def test_groups_by_one_label(self) -> None:
        by_endpoint = parse(TEXT).by_label("jetserve_http_requests_total", "endpoint")
        assert by_endpoint == {"/v1/chat/completions": 8, "/v1/completions": 3}

    def test_names_with_a_custom_prefix_read_as_the_code_writes_them(self) -> None:
        samples = parse(TEXT.replace("jetserve_", "acme_"), prefix="acme_")
        assert samples.total("jetserve_http_requests_total") == 11
        assert "jetserve_errors" in samples.families

    def test_a_custom_prefix_leaves_default_names_alone(self) -> None:
        assert parse(TEXT, prefix="acme_").total("jetserve_http_requests_total") == 11

    def test_bad_text_is_a_value_error(self) -> None:
        with pytest.raises(ValueError, match="not Prometheus text"):
            parse("not metrics {{{\n")


class TestWindow:
    def test_rate_is_the_growth_between_the_window_ends(self) -> None:
        history = [Scrape("u", at, parse(_counter(v))) for at, v in ((0, 1), (1, 5), (2, 9))]
        w = window(history, now=2, window_s=2)
        assert w is not None
        assert w.span_s == 2
        assert w.per_s(w.delta("c_total")) == 4

    def test_takes_the_newest_scrape_a_whole_window_old(self) -> None:
        history = [Scrape("u", at, parse(_counter(at))) for at in range(10)]
        w = window(history, now=9, window_s=3)
        assert w is not None
        assert w.old is not None
        assert w.old.at == 6

    def test_a_counter_that_restarted_counts_from_zero(self) -> None:
        history = [Scrape("u", 0, parse(_counter(50))), Scrape("u", 1, parse(_counter(4)))]
        w = window(history, now=1, window_s=1)
        assert w is not None
        assert w.delta("c_total") == 4

    def test_one_scrape_has_no_rate(self) -> None:
        w = window([Scrape("u", 0, parse(_counter(3)))], now=0, window_s=2)
        assert w is not None
        assert w.delta("c_total") is None

    def test_failed_scrapes_are_skipped(self) -> None:
        assert window([Scrape("u", 0, error="refused")], now=0, window_s=2) is None


BUCKETS = {0.1: 0.0, 0.2: 50.0, 0.5: 90.0, 1.0: 100.0, float("inf"): 100.0}


class TestHistogramQuantile:
    def test_interpolates_inside_the_bucket_as_prometheus_does(self) -> None:
        assert histogram_quantile(0.5, BUCKETS) == pytest.approx(0.2)
        assert histogram_quantile(0.25, BUCKETS) == pytest.approx(0.15)
        assert histogram_quantile(0.99, BUCKETS) == pytest.approx(0.95)

    def test_a_quantile_in_the_inf_bucket_is_the_highest_finite_bound(self) -> None:
        assert histogram_quantile(0.99, {1.0: 1.0, float("inf"): 10.0}) == 1.0

    def test_no_observations_no_quantile(self) -> None:
        assert histogram_quantile(0.5, {1.0: 0.0, float("inf"): 0.0}) is None


def test_quantile_of_values_is_linear_between_ranks() -> None:
    assert quantile(0.5, [4.0, 1.0, 3.0, 2.0]) == pytest.approx(2.5)
    assert quantile(0.99, []) is None


class TestTally:
    def test_sums_amounts_and_events_since_a_time(self) -> None:
        tally = Tally(keep_s=60)
        for at in (0.0, 1.0, 2.0, 3.0):
            tally.add(at, 10)
        assert tally.since(1.5) == (20, 2)

    def test_forgets_what_is_older_than_it_keeps(self) -> None:
        tally = Tally(keep_s=5)
        tally.add(0.0, 1)
        tally.add(10.0, 1)
        assert tally.since(-100) == (1, 1)
