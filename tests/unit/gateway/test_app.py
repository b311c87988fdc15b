"""The Litestar side of the app (lifespan, probes, listing, OpenAPI), with a fake bus."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from services.gateway.config import GatewayConfig
from services.gateway.core.readiness import Readiness
from services.gateway.http.app import create_app
from shared.messages import WorkerCard
from tests.unit.gateway.fakes import CHAT, FakeBus


@pytest.fixture
def bus() -> FakeBus:
    return FakeBus()


@pytest.fixture
def readiness() -> Readiness:
    return Readiness()


@pytest.fixture
async def http(bus: FakeBus, readiness: Readiness) -> AsyncIterator[AsyncTestClient[Any]]:
    config = GatewayConfig(request_timeout_s=0.2, stream_idle_timeout_s=0.2, gateway_id="gw")
    app = create_app(config, bus=bus, readiness=readiness)
    async with AsyncTestClient(app) as client:
        yield client


async def test_lifespan_starts_and_stops_the_bus(bus: FakeBus) -> None:
    app = create_app(GatewayConfig(), bus=bus)
    async with AsyncTestClient(app):
        assert bus.started
    assert bus.stopped


async def test_draining_says_so_on_health_but_serves_what_still_arrives(
    http: AsyncTestClient[Any], readiness: Readiness, bus: FakeBus
) -> None:
    readiness.begin_shutdown()
    chat, health = await http.post("/v1/chat/completions", json=CHAT), await http.get("/health")
    assert [r.request_id for r in bus.submitted] == [chat.headers["x-request-id"]]
    assert (health.status_code, health.json()["status"]) == (503, "shutting_down")


async def test_models_use_the_model_card_created_time(http: AsyncTestClient[Any]) -> None:
    response = await http.get("/v1/models")
    assert response.json() == {
        "object": "list",
        "data": [
            {
                "id": "m",
                "object": "model",
                "created": 123,
                "owned_by": "jetserve",
                "root": None,
                "parent": None,
                "jetserve": {"workers": {"prefill": 0, "decode": 0, "both": 1}, "dp_ranks": 1},
            }
        ],
    }


async def test_models_count_their_live_workers_by_role_and_data_parallel_ranks(
    bus: FakeBus, http: AsyncTestClient[Any]
) -> None:
    bus.cards_of_workers = [
        WorkerCard(worker_id="a", model="m"),
        WorkerCard(worker_id="p1", model="m", role="prefill"),
        WorkerCard(worker_id="p2", model="m", role="prefill", dp_size=2),
        WorkerCard(worker_id="d1", model="m", role="decode", dp_size=4),
        WorkerCard(worker_id="other", model="n", role="decode"),
    ]
    (model,) = (await http.get("/v1/models")).json()["data"]
    assert model["jetserve"] == {
        "workers": {"both": 1, "prefill": 2, "decode": 1},
        "dp_ranks": 1 + 1 + 2 + 4,
    }


async def test_openapi_describes_the_inference_endpoints(http: AsyncTestClient[Any]) -> None:
    response = await http.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    schemas = document["components"]["schemas"]

    def body_schema(path: str) -> dict[str, Any]:
        operation = document["paths"][path]["post"]
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert operation["responses"]["4XX"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorResponse"
        }
        schema: dict[str, Any] = schemas[ref.rpartition("/")[2]]
        return schema

    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health"} <= set(
        document["paths"]
    )
    assert "messages" in body_schema("/v1/chat/completions")["required"]
    assert "prompt" in body_schema("/v1/completions")["required"]
    assert set(schemas["ErrorDetail"]["properties"]) == {"message", "type", "code", "param"}
    docs = await http.get("/docs")
    assert docs.status_code == 200
    assert docs.headers["content-type"].startswith("text/html")
    assert "SwaggerUIBundle" in docs.text
    assert (await http.get("/")).status_code == 404
