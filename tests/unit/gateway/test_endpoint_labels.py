"""Every inference path is its own ``endpoint`` label (not ``other``), and the dashboard's
request panels select it (their filters drop only probes and ``other``)."""

from __future__ import annotations

import re

import pytest

from services.gateway.config import GatewayConfig
from services.gateway.core.metrics import GatewayMetrics, endpoint_of
from services.gateway.core.paths import Paths
from tests.observability import dashboard_exprs

INFERENCE = sorted(Paths().all() - Paths().probes)
_EXCLUDED = re.compile(r'endpoint!~"([^"]*)"')


def test_the_default_paths_are_the_metrics_default_labels() -> None:
    assert Paths().all() == Paths.of(GatewayConfig()).all()
    assert all(endpoint_of(path) == path for path in Paths().all())
    assert endpoint_of("/wp-admin") == "other"


def test_moved_paths_are_labelled_where_they_are_served() -> None:
    paths = Paths.of(GatewayConfig(chat_path="/chat/completions", embeddings_path="/embed"))
    metrics = GatewayMetrics(routes=paths.all())
    metrics.observe("/chat/completions", 200, 0.1, 0.05, None, 3)
    metrics.observe("/v1/chat/completions", 404, 0.001, None, None, 0)
    text = metrics.exposition().decode()
    assert 'endpoint="/chat/completions",status="200"' in text
    assert 'endpoint="other",status="404"' in text


@pytest.mark.parametrize("path", INFERENCE)
def test_the_request_panels_show_every_inference_path(path: str) -> None:
    filters = [
        (title, m.group(1))
        for title, expr in dashboard_exprs()
        if "jetserve_http_request" in expr
        for m in _EXCLUDED.finditer(expr)
    ]
    assert filters  # the panels filter by endpoint: the check below reads something
    hidden = [title for title, regex in filters if re.fullmatch(regex, path)]
    assert hidden == []
