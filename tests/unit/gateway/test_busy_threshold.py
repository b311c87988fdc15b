"""``POST`` / ``GET /busy_threshold`` at the HTTP edge (the app with a fake bus), as Dynamo's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from services.gateway.config import GatewayConfig
from services.gateway.http.app import create_app
from shared.messages import BusyThresholdsChanged, ModelCard
from tests.unit.gateway.fakes import FakeBus

NONE = {
    "active_decode_blocks_threshold": None,
    "active_prefill_tokens_threshold": None,
    "active_prefill_tokens_threshold_frac": None,
}


@pytest.fixture
def bus() -> FakeBus:
    return FakeBus()


@pytest.fixture
async def http(bus: FakeBus) -> AsyncIterator[AsyncTestClient[Any]]:
    config = GatewayConfig(gateway_id="gw", busy_threshold_path="/admin/busy")
    async with AsyncTestClient(create_app(config, bus=bus)) as client:
        yield client


async def test_setting_stores_and_answers_the_thresholds(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    body = {"model": "m", "active_decode_blocks_threshold": 0.85}
    response = await http.post("/admin/busy", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {**NONE, "model": "m", "active_decode_blocks_threshold": 0.85}
    assert bus.thresholds["m"] == BusyThresholdsChanged(
        model="m", active_decode_blocks_threshold=0.85, revision=1
    )


async def test_a_body_naming_no_threshold_answers_the_current_ones(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    await http.post("/admin/busy", json={"model": "m", "active_prefill_tokens_threshold": 100})
    response = await http.post("/admin/busy", json={"model": "m"})
    assert response.json() == {**NONE, "model": "m", "active_prefill_tokens_threshold": 100}
    assert len(bus.thresholds) == 1


async def test_a_model_never_set_answers_nulls(http: AsyncTestClient[Any]) -> None:
    response = await http.post("/admin/busy", json={"model": "m"})
    assert response.json() == {**NONE, "model": "m"}


async def test_setting_replaces_every_threshold_of_the_model(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    await http.post("/admin/busy", json={"model": "m", "active_decode_blocks_threshold": 0.5})
    await http.post("/admin/busy", json={"model": "m", "active_prefill_tokens_threshold": 7})
    stored = bus.thresholds["m"]
    assert (stored.active_decode_blocks_threshold, stored.active_prefill_tokens_threshold) == (
        None,
        7,
    )


async def test_nulls_clear_the_model_and_get_leaves_it_out(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    await http.post("/admin/busy", json={"model": "m", "active_decode_blocks_threshold": 0.5})
    cleared = await http.post("/admin/busy", json={"model": "m", **NONE})
    assert cleared.json() == {**NONE, "model": "m"}
    listed = await http.get("/admin/busy")
    assert listed.json() == {"thresholds": []}


async def test_get_lists_every_model_with_thresholds(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    await http.post("/admin/busy", json={"model": "m", "active_prefill_tokens_threshold_frac": 0.8})
    response = await http.get("/admin/busy")
    assert response.status_code == 200
    assert response.json() == {
        "thresholds": [{**NONE, "model": "m", "active_prefill_tokens_threshold_frac": 0.8}]
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "active_decode_blocks_threshold": 1.5}, "active_decode_blocks_threshold"),
        ({"model": "m", "active_decode_blocks_threshold": "x"}, "active_decode_blocks_threshold"),
        ({"model": "m", "active_prefill_tokens_threshold": -1}, "active_prefill_tokens_threshold"),
        ({"model": "m", "active_prefill_tokens_threshold": 1.5}, "active_prefill_tokens_threshold"),
        (
            {"model": "m", "active_prefill_tokens_threshold_frac": -0.1},
            "active_prefill_tokens_threshold_frac",
        ),
        ({"model": ""}, "model"),
        ({"active_decode_blocks_threshold": 0.5}, "model"),
        ({"model": "m", "threshold": 0.5}, "threshold"),
    ],
)
async def test_a_bad_body_is_a_400_naming_the_field(
    http: AsyncTestClient[Any], bus: FakeBus, body: dict[str, Any], param: str
) -> None:
    response = await http.post("/admin/busy", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert bus.thresholds == {}


async def test_a_body_that_is_not_json_is_a_400(http: AsyncTestClient[Any]) -> None:
    response = await http.post("/admin/busy", content=b"{nope")
    assert response.status_code == 400


async def test_setting_an_unknown_model_is_a_404(http: AsyncTestClient[Any], bus: FakeBus) -> None:
    bus.cards["ghost"] = None
    bus.is_live = lambda model: model != "ghost"  # type: ignore[method-assign]
    response = await http.post(
        "/admin/busy", json={"model": "ghost", "active_decode_blocks_threshold": 0.5}
    )
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "model_not_found"
    assert bus.thresholds == {}


async def test_a_model_with_a_card_but_no_live_worker_may_be_set(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    bus.cards["later"] = ModelCard(model="later", context_length=8)
    bus.is_live = lambda model: False  # type: ignore[method-assign]
    response = await http.post(
        "/admin/busy", json={"model": "later", "active_decode_blocks_threshold": 0.5}
    )
    assert response.status_code == 200, response.text


async def test_the_endpoint_needs_an_api_key_when_keys_are_set(bus: FakeBus) -> None:
    config = GatewayConfig(gateway_id="gw", api_key="sk-1")
    async with AsyncTestClient(create_app(config, bus=bus)) as client:
        refused = await client.get("/busy_threshold")
        allowed = await client.get("/busy_threshold", headers={"authorization": "Bearer sk-1"})
    assert (refused.status_code, allowed.status_code) == (401, 200)
