"""``GET /metrics`` on the gateway, and the routing headers through the HTTP route."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from services.gateway.config import GatewayConfig
from services.gateway.core.metrics import GatewayMetrics, endpoint_of
from services.gateway.http.app import create_app
from shared.messages import ResponseChunk
from tests.unit.gateway.fakes import CHAT, FakeBus


def _sample(text: str, name: str) -> float:
    """The value of the sample written exactly ``name`` (with its labels) in ``text``."""
    for row in text.splitlines():
        key, _, value = row.rpartition(" ")
        if key == name:
            return float(value)
    raise AssertionError(f"{name} not in exposition")


async def test_metrics_count_requests_by_endpoint_and_status() -> None:
    bus = FakeBus()
    bus.script = [ResponseChunk(request_id="r", data=b"{}", done=True)]
    bus.pending = 3
    app = create_app(GatewayConfig(), bus=bus, metrics=GatewayMetrics())
    async with AsyncTestClient(app) as http:
        assert (await http.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await http.post("/v1/chat/completions", content=b"{")).status_code == 400
        response = await http.get("/metrics")
    text = response.text
    assert response.headers["content-type"].startswith("text/plain")
    ok = 'jetserve_http_requests_total{endpoint="/v1/chat/completions",status="200"}'
    bad = 'jetserve_http_requests_total{endpoint="/v1/chat/completions",status="400"}'
    assert _sample(text, ok) == 1.0
    assert _sample(text, bad) == 1.0
    assert _sample(text, 'jetserve_errors_total{code="invalid_request",service="gateway"}') == 1
    assert _sample(text, 'jetserve_in_flight{service="gateway"}') == 3.0
    ttft = 'jetserve_gateway_ttft_seconds_count{endpoint="/v1/chat/completions"}'
    assert _sample(text, ttft) == 1.0
    latency = 'jetserve_http_request_seconds_count{endpoint="/v1/chat/completions"}'
    assert _sample(text, latency) == 2.0


def test_unknown_paths_share_one_label() -> None:
    assert endpoint_of("/v1/chat/completions") == "/v1/chat/completions"
    assert endpoint_of("/wp-admin/x") == "other"


async def test_routing_headers_reach_the_bus_message() -> None:
    bus = FakeBus()
    bus.script = [ResponseChunk(request_id="r", data=b"{}", done=True)]
    app = create_app(GatewayConfig(), bus=bus)
    headers = {"x-worker-instance-id": "w1", "x-tenant-id": "acme"}
    async with AsyncTestClient(app) as http:
        await http.post("/v1/chat/completions", json=CHAT, headers=headers)
        bad = await http.post(
            "/v1/chat/completions", json=CHAT, headers={"x-worker-instance-id": "a.b"}
        )
    sent: Any = bus.submitted[0]
    assert (sent.worker_id, sent.routing.cache_salt) == ("w1", "acme")
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "x-worker-instance-id")


def test_itl_is_the_mean_time_per_token_after_the_first() -> None:
    metrics = GatewayMetrics()
    chat = "/v1/chat/completions"
    metrics.observe(chat, 200, 1.1, ttft_s=0.1, completion_tokens=11)
    metrics.observe(chat, 200, 0.5, ttft_s=0.5, completion_tokens=1)  # one token: no ITL
    metrics.observe_grpc("ModelInfer", "OK", 0.3, ttft_s=0.1, completion_tokens=3)
    text = metrics.exposition().decode()
    itl = "jetserve_gateway_itl_seconds"
    grpc = '{endpoint="/inference.GRPCInferenceService/ModelInfer"}'
    assert _sample(text, f'{itl}_count{{endpoint="{chat}"}}') == 1.0
    assert _sample(text, f'{itl}_sum{{endpoint="{chat}"}}') == pytest.approx(0.1)
    assert _sample(text, f"{itl}_sum{grpc}") == pytest.approx(0.1)
