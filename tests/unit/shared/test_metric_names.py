"""``--metrics-prefix``: names as the code writes them and as a scrape shows them."""

from __future__ import annotations

import pytest

from shared.metric_names import DEFAULT_PREFIX, canonical, prefix_problem, prefixed


@pytest.mark.parametrize("prefix", ["acme_", "jetserve_", "jetserve_v2_", "a", "ns:svc_", "_x"])
def test_a_prefix_round_trips_every_name(prefix: str) -> None:
    for name in ("jetserve_in_flight", "jetserve_router_decisions_total", "jetserve_messages"):
        assert canonical(prefixed(name, prefix), prefix) == name


def test_the_default_prefix_changes_nothing() -> None:
    assert prefixed("jetserve_in_flight", DEFAULT_PREFIX) == "jetserve_in_flight"
    assert prefixed("jetserve_in_flight", "acme_") == "acme_in_flight"


def test_a_name_still_on_the_default_prefix_reads_as_it_is() -> None:
    """A service not (yet) started with the prefix, scraped beside ones that are."""
    assert canonical("jetserve_http_requests_total", "acme_") == "jetserve_http_requests_total"
    assert canonical("jetserve_http_requests_total", "jet") == "jetserve_http_requests_total"
    assert canonical("other_total", "acme_") == "other_total"


@pytest.mark.parametrize("prefix", ["", "1x_", "a-b_", "a b", "é_"])
def test_a_prefix_that_cannot_start_a_metric_name_is_refused(prefix: str) -> None:
    assert prefix_problem(prefix) is not None


def test_a_valid_prefix_has_no_problem() -> None:
    assert prefix_problem("acme_") is None
