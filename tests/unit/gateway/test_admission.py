"""Admission (``--max-concurrent-requests``): the counter alone, then in front of the HTTP
inference path and in ``/metrics``."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from services.gateway.admission import Admission
from services.gateway.app import create_app
from services.gateway.config import GatewayConfig
from services.gateway.metrics import GatewayMetrics
from shared.errors import InvalidRequest, Overloaded
from shared.messages import ResponseChunk
from tests.unit.gateway.fakes import CHAT, FakeBus


class TestAdmission:
    def test_admits_up_to_the_limit_then_refuses(self) -> None:
        admission = Admission(2)
        assert [admission.try_enter() for _ in range(3)] == [True, True, False]
        assert (admission.in_flight, admission.rejected) == (2, 1)

    def test_a_slot_given_back_admits_the_next_request(self) -> None:
        admission = Admission(1)
        admission.try_enter()
        admission.leave()
        assert admission.try_enter()
        assert (admission.in_flight, admission.rejected) == (1, 0)

    def test_zero_means_no_limit(self) -> None:
        admission = Admission(0)
        assert all(admission.try_enter() for _ in range(10_000))
        assert admission.rejected == 0

    def test_leave_without_a_slot_is_a_bug(self) -> None:
        with pytest.raises(RuntimeError, match="without a slot"):
            Admission(1).leave()

    def test_negative_limit_is_refused(self) -> None:
        with pytest.raises(ValueError, match=">= 0"):
            Admission(-1)

    def test_refusal_is_a_retryable_503_with_retry_after(self) -> None:
        error = Admission(7).refusal()
        assert isinstance(error, Overloaded)
        assert (error.code, error.status, error.type, error.retryable) == (
            "overloaded",
            503,
            "service_unavailable",
            True,
        )
        assert error.headers() == {"Retry-After": "1"}
        assert "limit of 7 concurrent requests" in error.message


class TestAdmissionBlock:
    def test_raises_overloaded_when_full_and_takes_no_slot(self) -> None:
        admission = Admission(1)
        admission.try_enter()
        with pytest.raises(Overloaded), admission:
            pass
        assert (admission.in_flight, admission.rejected) == (1, 1)

    def test_gives_the_slot_back_when_the_body_raises(self) -> None:
        admission = Admission(1)
        with pytest.raises(InvalidRequest), admission:
            raise InvalidRequest("bad")
        assert admission.in_flight == 0

    async def test_gives_the_slot_back_when_the_task_is_cancelled(self) -> None:
        admission = Admission(1)
        entered = asyncio.Event()

        async def hold() -> None:
            with admission:
                entered.set()
                await asyncio.Event().wait()

        task = asyncio.ensure_future(hold())
        await asyncio.wait_for(entered.wait(), 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert admission.in_flight == 0


class TestHttpAdmission:
    """The ASGI wrapper in ``app.py``, driven through Litestar's test client (no sockets)."""

    async def test_over_the_limit_is_503_with_retry_after_and_the_openai_body(self) -> None:
        bus = FakeBus()
        admission = Admission(1)
        admission.try_enter()  # another request holds the only slot
        app = create_app(GatewayConfig(), bus=bus, admission=admission)  # type: ignore[arg-type]
        async with AsyncTestClient(app) as http:
            response = await http.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.headers["x-request-id"]
        error = msgspec.json.decode(response.content)["error"]
        assert (error["code"], error["type"]) == ("overloaded", "service_unavailable")
        assert bus.submitted == []  # refused before any work

    async def test_the_slot_is_given_back_after_a_response_and_after_an_error(self) -> None:
        bus = FakeBus()
        bus.script = [ResponseChunk(request_id="r", data=b"{}", done=True)]
        admission = Admission(1)
        app = create_app(GatewayConfig(), bus=bus, admission=admission)  # type: ignore[arg-type]
        async with AsyncTestClient(app) as http:
            ok = await http.post("/v1/chat/completions", json=CHAT)
            bad = await http.post("/v1/chat/completions", content=b"{")
            again = await http.post("/v1/chat/completions", json=CHAT)
        assert [r.status_code for r in (ok, bad, again)] == [200, 400, 200]
        assert (admission.in_flight, admission.rejected) == (0, 0)

    async def test_other_methods_are_405_even_when_full(self) -> None:
        admission = Admission(1)
        admission.try_enter()
        app = create_app(GatewayConfig(), bus=FakeBus(), admission=admission)  # type: ignore[arg-type]
        async with AsyncTestClient(app) as http:
            response = await http.get("/v1/chat/completions")
        assert response.status_code == 405
        assert admission.rejected == 0

    async def test_the_limit_comes_from_the_config(self) -> None:
        metrics = GatewayMetrics()
        config = GatewayConfig(max_concurrent_requests=5)
        create_app(config, bus=FakeBus(), metrics=metrics)  # type: ignore[arg-type]
        text = metrics.exposition().decode()
        assert "jetserve_gateway_max_concurrent_requests 5.0" in text.splitlines()


async def test_metrics_show_requests_in_flight_the_limit_and_refusals() -> None:
    metrics = GatewayMetrics()
    admission = Admission(1)
    admission.try_enter()
    app = create_app(GatewayConfig(), bus=FakeBus(), metrics=metrics, admission=admission)  # type: ignore[arg-type]
    async with AsyncTestClient(app) as http:
        await http.post("/v1/chat/completions", json=CHAT)
        lines = (await http.get("/metrics")).text.splitlines()
    assert "jetserve_gateway_concurrent_requests 1.0" in lines
    assert "jetserve_gateway_max_concurrent_requests 1.0" in lines
    assert 'jetserve_gateway_rejected_total{reason="overloaded"} 1.0' in lines
    assert 'jetserve_errors_total{code="overloaded",service="gateway"} 1.0' in lines
