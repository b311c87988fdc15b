"""Issue 24's pins and query-only mode at the HTTP edge (the app with a fake bus): a malformed
pin is a 400 in OpenAI's error shape naming the field or header the client used, before anything
is sent; a good one reaches the bus; the router's verdicts (typed errors) come back as theirs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from services.gateway.config import GatewayConfig
from services.gateway.http.app import create_app
from shared.errors import from_message
from shared.messages import RequestFailed, RoutingHints
from tests.unit.gateway.fakes import CHAT, FakeBus

COMPLETION = {"model": "m", "prompt": "hi"}


@pytest.fixture
def bus() -> FakeBus:
    return FakeBus()


@pytest.fixture
async def http(bus: FakeBus) -> AsyncIterator[AsyncTestClient[Any]]:
    config = GatewayConfig(
        request_timeout_s=0.2, stream_idle_timeout_s=0.2, gateway_id="gw", retry_budget_s=0
    )
    app = create_app(config, bus=bus)
    async with AsyncTestClient(app) as client:
        yield client


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "code", "param"}
    error: dict[str, Any] = body["error"]
    return error


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x-dynamo-dp-rank", "-1"),
        ("x-dynamo-dp-rank", "one"),
        ("x-dp-rank", "1.5"),
        ("x-data-parallel-rank", "99999999"),
        ("x-dynamo-prefill-dp-rank", "x"),
        ("x-prefill-dp-rank", "-2"),
        ("x-dynamo-prefill-instance-id", "a.b"),
        ("x-prefill-instance-id", "p 1"),
        ("x-dynamo-worker-instance-id", "*"),
    ],
)
async def test_a_malformed_pin_header_is_400_naming_the_header(
    http: AsyncTestClient[Any], bus: FakeBus, path: str, header: str, value: str
) -> None:
    body = CHAT if path == "/v1/chat/completions" else COMPLETION
    error = error_of(await http.post(path, json=body, headers={header: value}), 400)
    assert (error["code"], error["type"], error["param"]) == (
        "invalid_request",
        "invalid_request_error",
        header,
    )
    assert bus.submitted == []


@pytest.mark.parametrize(
    ("nvext", "param"),
    [
        ({"dp_rank": -1}, "nvext.dp_rank"),
        ({"dp_rank": "0"}, "nvext.dp_rank"),
        ({"prefill_dp_rank": 65536}, "nvext.prefill_dp_rank"),
        ({"prefill_worker_id": "a.b"}, "nvext.prefill_worker_id"),
        ({"decode_worker_id": ">"}, "nvext.decode_worker_id"),
        ({"decode_worker_id": "a", "backend_instance_id": "b"}, "nvext.decode_worker_id"),
    ],
)
async def test_a_malformed_body_pin_is_400_naming_the_field(
    http: AsyncTestClient[Any], bus: FakeBus, nvext: dict[str, Any], param: str
) -> None:
    response = await http.post("/v1/chat/completions", json={**CHAT, "nvext": nvext})
    assert error_of(response, 400)["param"] == param
    assert bus.submitted == []


@pytest.mark.parametrize(
    ("headers", "nvext", "param"),
    [
        ({"x-dynamo-worker-instance-id": "b"}, {"decode_worker_id": "a"}, "nvext.decode_worker_id"),
        (
            {"x-dynamo-prefill-instance-id": "b"},
            {"prefill_worker_id": "a"},
            "nvext.prefill_worker_id",
        ),
        ({"x-dynamo-dp-rank": "1"}, {"dp_rank": 0}, "nvext.dp_rank"),
        ({"x-dynamo-prefill-dp-rank": "1"}, {"prefill_dp_rank": 0}, "nvext.prefill_dp_rank"),
    ],
)
async def test_a_header_and_body_pin_that_disagree_are_400(
    http: AsyncTestClient[Any],
    bus: FakeBus,
    headers: dict[str, str],
    nvext: dict[str, Any],
    param: str,
) -> None:
    response = await http.post(
        "/v1/chat/completions", json={**CHAT, "nvext": nvext}, headers=headers
    )
    assert error_of(response, 400)["param"] == param
    assert bus.submitted == []


async def test_header_pins_reach_the_bus(http: AsyncTestClient[Any], bus: FakeBus) -> None:
    headers = {
        "x-dynamo-worker-instance-id": "d1",
        "x-dynamo-prefill-instance-id": "p1",
        "x-dynamo-dp-rank": "2",
        "x-dynamo-prefill-dp-rank": "1",
    }
    await http.post("/v1/completions", json=COMPLETION, headers=headers)
    [sent] = bus.submitted
    assert sent.worker_id == "d1"
    assert sent.routing == RoutingHints(
        prefill_worker_id="p1",
        dp_rank=2,
        prefill_dp_rank=1,
        decode_worker_id_param="x-dynamo-worker-instance-id",
    )


async def test_body_pins_and_a_query_reach_the_bus(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    nvext = {
        "decode_worker_id": "d1",
        "prefill_worker_id": 7,
        "dp_rank": 0,
        "annotations": ["query_instance_id"],
    }
    await http.post("/v1/chat/completions", json={**CHAT, "nvext": nvext})
    [sent] = bus.submitted
    assert sent.worker_id == "d1"
    assert sent.routing == RoutingHints(
        prefill_worker_id="7",
        dp_rank=0,
        decode_worker_id_param="nvext.decode_worker_id",
        query_only=True,
    )


async def test_the_routers_400_for_a_pin_comes_back_naming_the_field(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    bus.script = [
        from_message(
            RequestFailed(
                request_id="r1",
                code="invalid_request",
                message="worker p9 is not a prefill worker (its role is decode)",
                status=400,
                param="nvext.prefill_worker_id",
            )
        )
    ]
    response = await http.post(
        "/v1/chat/completions", json={**CHAT, "nvext": {"prefill_worker_id": "p9"}}
    )
    error = error_of(response, 400)
    assert (error["code"], error["param"]) == ("invalid_request", "nvext.prefill_worker_id")
    assert "p9" in error["message"]


async def test_the_routers_503_for_a_dead_pin_comes_back_with_retry_after(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    bus.script = [
        from_message(
            RequestFailed(
                request_id="r1",
                code="no_worker_available",
                message="worker d1 is not live",
                status=503,
                retry_after_s=1.0,
            )
        )
    ]
    response = await http.post(
        "/v1/chat/completions", json={**CHAT, "nvext": {"decode_worker_id": "d1"}}
    )
    assert error_of(response, 503)["code"] == "no_worker_available"
    assert response.headers["retry-after"] == "1"
