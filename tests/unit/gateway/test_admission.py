"""Admission (``--max-concurrent-requests``, ``--max-connection-share``): the counter alone,
then in front of the HTTP inference path (one owner per client connection), with its writes
bounded by ``--send-timeout-s`` (``BoundedSend``), and in ``/metrics``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from litestar.types import HTTPResponseBodyEvent, Message
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from services.gateway.config import GatewayConfig
from services.gateway.core.admission import Admission
from services.gateway.core.metrics import GatewayMetrics
from services.gateway.http.app import create_app
from services.gateway.http.stalls import BoundedSend
from shared.errors import InvalidRequest, Overloaded
from shared.messages import ResponseChunk
from tests.unit.gateway.fakes import CHAT, FakeBus

TEST_CLIENT = ("testclient", 50000)
"""The ``client`` of every request Litestar's test client sends: one connection."""


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


class TestConnectionShare:
    def test_an_owner_at_its_share_is_refused_while_another_is_admitted(self) -> None:
        admission = Admission(8, connection_share=0.25)
        assert admission.per_owner == 2
        assert [admission.try_enter("a") for _ in range(3)] == [True, True, False]
        refusal = admission.refusal("a")
        assert admission.try_enter("b")
        assert (admission.in_flight, admission.rejected) == (3, 1)
        assert isinstance(refusal, Overloaded)
        assert refusal.message.startswith("This connection holds 2 requests in flight")
        assert "gateway's 8" in refusal.message
        assert refusal.headers() == {"Retry-After": "1"}

    def test_leave_frees_the_owners_slot(self) -> None:
        admission = Admission(4, connection_share=0.25)
        assert admission.try_enter("a")
        assert not admission.try_enter("a")
        admission.leave("a")
        assert (admission.held_by("a"), admission.in_flight) == (0, 0)
        assert admission.try_enter("a")

    def test_a_full_gateway_is_refused_with_the_limit_whoever_asks(self) -> None:
        admission = Admission(2, connection_share=0.5)
        assert [admission.try_enter(owner) for owner in "abc"] == [True, True, False]
        assert "limit of 2 concurrent requests" in admission.refusal("c").message

    def test_a_share_of_one_is_no_share(self) -> None:
        admission = Admission(3, connection_share=1.0)
        assert admission.per_owner == 0
        assert [admission.try_enter("a") for _ in range(4)] == [True, True, True, False]
        assert "limit of 3" in admission.refusal("a").message

    def test_no_limit_is_no_share(self) -> None:
        admission = Admission(0, connection_share=0.25)
        assert admission.per_owner == 0
        assert all(admission.try_enter("a") for _ in range(1000))

    def test_a_small_limit_still_gives_each_owner_one_slot(self) -> None:
        assert Admission(1, connection_share=0.25).per_owner == 1

    def test_the_share_must_be_in_0_to_1(self) -> None:
        for share in (0.0, -0.5, 1.5):
            with pytest.raises(ValueError, match="connection_share"):
                Admission(4, connection_share=share)


class TestAdmissionBlock:
    def test_raises_overloaded_when_full_and_takes_no_slot(self) -> None:
        admission = Admission(1)
        admission.try_enter()
        with pytest.raises(Overloaded), admission.slot():
            pass
        assert (admission.in_flight, admission.rejected) == (1, 1)

    def test_gives_the_slot_back_when_the_body_raises(self) -> None:
        admission = Admission(1)
        with pytest.raises(InvalidRequest), admission.slot():
            raise InvalidRequest("bad")
        assert admission.in_flight == 0

    async def test_gives_the_slot_back_when_the_task_is_cancelled(self) -> None:
        admission = Admission(1)
        entered = asyncio.Event()

        async def hold() -> None:
            with admission.slot():
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
        app = create_app(GatewayConfig(), bus=bus, admission=admission)
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
        app = create_app(GatewayConfig(), bus=bus, admission=admission)
        async with AsyncTestClient(app) as http:
            ok = await http.post("/v1/chat/completions", json=CHAT)
            bad = await http.post("/v1/chat/completions", content=b"{")
            again = await http.post("/v1/chat/completions", json=CHAT)
        assert [r.status_code for r in (ok, bad, again)] == [200, 400, 200]
        assert (admission.in_flight, admission.rejected) == (0, 0)

    async def test_other_methods_are_405_even_when_full(self) -> None:
        admission = Admission(1)
        admission.try_enter()
        app = create_app(GatewayConfig(), bus=FakeBus(), admission=admission)
        async with AsyncTestClient(app) as http:
            response = await http.get("/v1/chat/completions")
        assert response.status_code == 405
        assert admission.rejected == 0

    async def test_a_connection_over_its_share_is_refused_while_others_are_admitted(
        self,
    ) -> None:
        bus = FakeBus()
        bus.script = [ResponseChunk(request_id="r", data=b"{}", done=True)]
        admission = Admission(4)  # a connection's share: 1
        admission.try_enter(TEST_CLIENT)  # this client's connection holds it
        app = create_app(GatewayConfig(), bus=bus, admission=admission)
        async with AsyncTestClient(app) as http:
            refused = await http.post("/v1/chat/completions", json=CHAT)
            assert admission.try_enter(("127.0.0.1", 1234))  # another connection
            admission.leave(TEST_CLIENT)
            served = await http.post("/v1/chat/completions", json=CHAT)
        error = msgspec.json.decode(refused.content)["error"]
        assert (refused.status_code, error["code"]) == (503, "overloaded")
        assert error["message"].startswith("This connection holds 1 request in flight")
        assert refused.headers["retry-after"] == "1"
        assert served.status_code == 200
        assert (admission.in_flight, admission.held_by(TEST_CLIENT)) == (1, 0)

    async def test_the_share_comes_from_the_config(self) -> None:
        bus = FakeBus()
        bus.script = [ResponseChunk(request_id="r", data=b"{}", done=True)]
        config = GatewayConfig(max_concurrent_requests=4, max_connection_share=1.0)
        metrics = GatewayMetrics()
        app = create_app(config, bus=bus, metrics=metrics)
        async with AsyncTestClient(app) as http:
            response = await http.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        assert "jetserve_gateway_max_concurrent_requests 4.0" in metrics.exposition().decode()

    async def test_the_limit_comes_from_the_config(self) -> None:
        metrics = GatewayMetrics()
        config = GatewayConfig(max_concurrent_requests=5)
        create_app(config, bus=FakeBus(), metrics=metrics)
        text = metrics.exposition().decode()
        assert "jetserve_gateway_max_concurrent_requests 5.0" in text.splitlines()


async def test_metrics_show_requests_in_flight_the_limit_and_refusals() -> None:
    metrics = GatewayMetrics()
    admission = Admission(1)
    admission.try_enter()
    app = create_app(GatewayConfig(), bus=FakeBus(), metrics=metrics, admission=admission)
    async with AsyncTestClient(app) as http:
        await http.post("/v1/chat/completions", json=CHAT)
        lines = (await http.get("/metrics")).text.splitlines()
    assert "jetserve_gateway_concurrent_requests 1.0" in lines
    assert "jetserve_gateway_max_concurrent_requests 1.0" in lines
    assert 'jetserve_gateway_rejected_total{reason="overloaded"} 1.0' in lines
    assert 'jetserve_errors_total{code="overloaded",service="gateway"} 1.0' in lines


# --- send timeout --------------------------------------------------------------------------------


class FakeTransport:
    def __init__(self, cycle: FakeCycle) -> None:
        self._cycle = cycle
        self.aborted = 0

    def abort(self) -> None:
        """As asyncio's: the connection is lost on the next loop turn."""
        self.aborted += 1
        asyncio.get_running_loop().call_soon(self._cycle.connection_lost)


class FakeFlow:
    def __init__(self, writable: asyncio.Event) -> None:
        self._writable = writable

    @property
    def write_paused(self) -> bool:
        return not self._writable.is_set()


class FakeCycle:
    """uvicorn's request cycle as ``BoundedSend`` sees it: ``send`` is its bound method, and
    waits while writing is paused (``flow.write_paused``); losing the connection resumes it (as
    ``connection_lost``). Without ``flow``, ``BoundedSend`` steps into each send to see."""

    def __init__(
        self, *, paused: bool = False, with_transport: bool = True, with_flow: bool = True
    ) -> None:
        self.writable = asyncio.Event()
        if not paused:
            self.writable.set()
        if with_flow:
            self.flow = FakeFlow(self.writable)
        self.disconnected = False
        self.lost = asyncio.Event()
        self.sent: list[Message] = []
        self.cancelled = False
        if with_transport:
            self.transport = FakeTransport(self)

    async def send(self, message: Message) -> None:
        if not self.writable.is_set() and not self.disconnected:
            try:
                await self.writable.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if not self.disconnected:
            self.sent.append(message)

    def connection_lost(self) -> None:
        self.disconnected = True
        self.lost.set()
        self.writable.set()


def counting_timers(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The delays of every ``call_later`` on the running loop from now on."""
    loop = asyncio.get_running_loop()
    delays: list[float] = []
    call_later = loop.call_later

    def spy(delay: float, callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
        delays.append(delay)
        return call_later(delay, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_later", spy)
    return delays


class StopsReadingAfterHeaders(FakeCycle):
    async def send(self, message: Message) -> None:
        await super().send(message)
        if message["type"] == "http.response.start":
            self.writable.clear()  # the client's buffers are full from now on


BODY: HTTPResponseBodyEvent = {"type": "http.response.body", "body": b"x", "more_body": True}


@pytest.mark.parametrize("with_flow", [True, False], ids=["uvicorn-flow", "stepped"])
class TestBoundedSend:
    async def test_a_send_that_does_not_wait_arms_no_timer(
        self, monkeypatch: pytest.MonkeyPatch, with_flow: bool
    ) -> None:
        cycle = FakeCycle(with_flow=with_flow)
        bounded = BoundedSend(cycle.send, 0.05)
        timers = counting_timers(monkeypatch)
        for _ in range(3):
            await bounded(BODY)
        assert (cycle.sent, timers, bounded.timed_out) == ([BODY] * 3, [], False)

    async def test_a_send_that_waits_in_time_is_not_cut(
        self, monkeypatch: pytest.MonkeyPatch, with_flow: bool
    ) -> None:
        cycle = FakeCycle(paused=True, with_flow=with_flow)
        bounded = BoundedSend(cycle.send, 30.0)
        timers = counting_timers(monkeypatch)
        sending = asyncio.ensure_future(bounded(BODY))
        await asyncio.sleep(0)  # it waits
        cycle.writable.set()  # the client read: the transport resumed
        await sending
        assert (cycle.sent, timers, bounded.timed_out) == ([BODY], [30.0], False)
        assert cycle.transport.aborted == 0

    async def test_a_send_waiting_past_the_timeout_aborts_the_connection(
        self, with_flow: bool
    ) -> None:
        cycle = FakeCycle(paused=True, with_flow=with_flow)
        bounded = BoundedSend(cycle.send, 0.0)
        await asyncio.wait_for(bounded(BODY), 5)
        await bounded(BODY)  # the connection is gone: no wait
        assert (bounded.timed_out, cycle.transport.aborted, cycle.disconnected) == (True, 1, True)
        assert cycle.sent == []

    async def test_cancelling_the_request_reaches_the_waiting_send(self, with_flow: bool) -> None:
        cycle = FakeCycle(paused=True, with_flow=with_flow)
        bounded = BoundedSend(cycle.send, 30.0)
        sending = asyncio.ensure_future(bounded(BODY))
        await asyncio.sleep(0)
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        assert (cycle.cancelled, bounded.timed_out, cycle.transport.aborted) == (True, False, 0)

    async def test_without_a_transport_the_timeout_is_only_logged(self, with_flow: bool) -> None:
        cycle = FakeCycle(paused=True, with_transport=False, with_flow=with_flow)
        bounded = BoundedSend(cycle.send, 0.0)
        with capture_logs() as logs:
            sending = asyncio.ensure_future(bounded(BODY))
            for _ in range(5):  # the timer fires on the next turn of the loop
                await asyncio.sleep(0)
            still_waiting = not sending.done()
            sending.cancel()
        assert (still_waiting, bounded.timed_out) == (True, True)
        assert [line["event"] for line in logs] == ["send_timeout_unenforced"]


async def test_a_stream_nobody_reads_is_ended_and_its_slot_freed() -> None:
    """Through ``Gateway`` and ``Relay``: the write waits on a client that stopped reading; past
    ``--send-timeout-s`` the connection is aborted, the request cancelled as a disconnect, the
    slot given back, and the access line and errors metric say ``send_timeout``."""
    bus = FakeBus()
    bus.script = [ResponseChunk(request_id="r1", data=b"data: {}\n\n")]  # then nothing more
    admission = Admission(4)
    metrics = GatewayMetrics()
    config = GatewayConfig(send_timeout_s=0.001, request_timeout_s=5, stream_idle_timeout_s=5)
    app = create_app(config, bus=bus, metrics=metrics, admission=admission)
    cycle = StopsReadingAfterHeaders()
    body = msgspec.json.encode({**CHAT, "stream": True})
    requests = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop(0)
        await cycle.lost.wait()
        return {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"x-request-id", b"r1")],
        "client": ("127.0.0.1", 1234),
    }
    with capture_logs(processors=[merge_contextvars]) as logs:
        await asyncio.wait_for(app(scope, receive, cycle.send), 5)  # type: ignore[arg-type]
    access = next(line for line in logs if line["event"] == "request_finished")
    timed_out = [line for line in logs if line["event"] == "send_timed_out"]
    assert (access["status"], access["error"]) == (200, "send_timeout")
    assert [(t["request_id"], t["timeout_s"]) for t in timed_out] == [("r1", 0.001)]
    assert bus.cancelled == [("r1", "client_disconnected")]
    assert cycle.transport.aborted == 1
    assert (admission.in_flight, admission.held_by(("127.0.0.1", 1234))) == (0, 0)
    errors = 'jetserve_errors_total{code="send_timeout",service="gateway"} 1.0'
    assert errors in metrics.exposition().decode().splitlines()
