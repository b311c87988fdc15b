"""The gRPC server's bounds on what a client can make it hold, without sockets: a connection
stops reading while its writes are paused, and a call's ``each_request`` can be paused."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from services.gateway.grpc.http2.calls import Call, CallLimits
from services.gateway.grpc.http2.connection import Http2Connection, Http2Settings

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PING, SETTINGS = 0x6, 0x4
ACK = 0x1


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame, built here rather than by the server's own helpers."""
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream_id)
        + payload
    )


def pings(n: int) -> bytes:
    return b"".join(frame(PING, 0, 0, struct.pack(">Q", i)) for i in range(n))


class FakeTransport:
    """Buffers writes; asks the protocol to pause past ``high`` bytes, as asyncio's do."""

    def __init__(self, protocol: Http2Connection, high: int) -> None:
        self.protocol = protocol
        self.high = high
        self.out = bytearray()
        self.written = 0
        self.is_write_paused = False
        self.is_reading = True

    def write(self, data: bytes) -> None:
        self.out += data
        self.written += len(data)
        if len(self.out) > self.high and not self.is_write_paused:
            self.is_write_paused = True
            self.protocol.pause_writing()

    def drain(self) -> None:
        """The peer read everything written so far."""
        self.out.clear()
        if self.is_write_paused:
            self.is_write_paused = False
            self.protocol.resume_writing()

    def pause_reading(self) -> None:
        self.is_reading = False

    def resume_reading(self) -> None:
        self.is_reading = True

    def close(self) -> None:
        pass


def ping_acks(data: bytes) -> int:
    """PING frames with the ACK flag in ``data`` (every frame of the server's is walked)."""
    count, pos = 0, 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        if data[pos + 3] == PING and data[pos + 4] & ACK:
            count += 1
        pos += 9 + length
    return count


class TestConnectionReadsNoMoreWhileWritesArePaused:
    async def test_a_ping_flood_from_a_client_that_does_not_read_stops_being_read(self) -> None:
        conn = Http2Connection(lambda stream, headers: None, Http2Settings())
        transport = FakeTransport(conn, high=1000)
        conn.connection_made(transport)  # type: ignore[arg-type]
        transport.drain()
        conn.data_received(PREFACE + frame(SETTINGS, 0, 0) + pings(1000))
        assert not transport.is_reading
        assert len(transport.out) < transport.high + 100  # not 1000 acks of 17 bytes
        assert ping_acks(bytes(transport.out)) < 100

    async def test_what_was_read_is_answered_once_the_client_reads_again(self) -> None:
        conn = Http2Connection(lambda stream, headers: None, Http2Settings())
        transport = FakeTransport(conn, high=1000)
        conn.connection_made(transport)  # type: ignore[arg-type]
        transport.drain()
        conn.data_received(PREFACE + frame(SETTINGS, 0, 0) + pings(1000))
        acks = 0
        for _ in range(100):
            acks += ping_acks(bytes(transport.out))
            if transport.is_reading:
                break
            transport.drain()
        assert (acks, transport.is_reading) == (1000, True)


# --- each_request ------------------------------------------------------------------------------


class FakeStream:
    """The ``Stream`` side a ``Call`` uses: what it gives back, and its end."""

    def __init__(self) -> None:
        self.consumed_bytes = 0
        self.is_mid_message = False
        self.is_open = True
        self.headers_sent = False
        self.ended_with: bytes | None = None

    def consumed(self, n: int) -> None:
        self.consumed_bytes += n

    def send_headers(self, block: bytes, *, end_stream: bool = False) -> None:
        self.ended_with = block
        self.is_open = not end_stream


class Handler:
    """A bidi-streaming method handler, as ``grpc.stream_stream_rpc_method_handler`` builds."""

    request_streaming = True
    response_streaming = True

    def __init__(self, method: Any) -> None:
        self.stream_stream = method
        self.request_deserializer = bytes
        self.response_serializer = bytes


def message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


async def pausing_call(seen: list[bytes], pause_at: int) -> tuple[Call, FakeStream]:
    """A call whose method pauses ``each_request`` once ``pause_at`` requests are handed out."""

    async def method(requests: Any, context: Call) -> None:
        def start(request: bytes) -> None:
            seen.append(request)
            if len(seen) == pause_at:
                context.pause_requests()

        await context.each_request(start)

    stream = FakeStream()
    limits = CallLimits(max_receive=1 << 20, max_send=1 << 20)
    call = Call(stream, "/t.S/M", Handler(method), [], None, "identity", limits)  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the method is waiting in each_request
    return call, stream


class TestPausedRequests:
    async def test_no_request_is_handed_out_while_paused(self) -> None:
        seen: list[bytes] = []
        call, _ = await pausing_call(seen, pause_at=2)
        call.data_received(message(b"a") + message(b"b") + message(b"c"), end_stream=False)
        assert seen == [b"a", b"b"]
        call.reset()

    async def test_the_window_is_held_while_paused_and_given_back_on_resume(self) -> None:
        seen: list[bytes] = []
        call, stream = await pausing_call(seen, pause_at=2)
        first = message(b"a") + message(b"b") + message(b"c")
        call.data_received(first, end_stream=False)
        call.data_received(message(b"d"), end_stream=False)
        held = stream.consumed_bytes
        call.resume_requests()
        assert (held, stream.consumed_bytes) == (len(first), len(first) + len(message(b"d")))
        assert seen == [b"a", b"b", b"c", b"d"]
        call.reset()

    async def test_the_method_ends_only_once_held_requests_are_handed_out(self) -> None:
        seen: list[bytes] = []
        call, _ = await pausing_call(seen, pause_at=1)
        call.data_received(message(b"a") + message(b"b"), end_stream=True)
        await asyncio.sleep(0.01)
        assert not call.task.done()
        call.resume_requests()
        await asyncio.wait_for(call.task, 1)
        assert seen == [b"a", b"b"]

    async def test_done_callbacks_run_once_the_call_is_over(self) -> None:
        seen: list[bytes] = []
        call, _ = await pausing_call(seen, pause_at=99)
        over: list[Call] = []
        call.add_done_callback(over.append)
        call.data_received(message(b"a"), end_stream=True)
        await asyncio.wait_for(call.task, 1)
        await asyncio.sleep(0)
        assert over == [call]
