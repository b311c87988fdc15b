"""The gateway's own HTTP/2 gRPC server (``grpcserver/``) at the protocol level.

A real ``Server`` listens on loopback in the test's event loop with a small probe servicer; the
client is ``h2``'s state machine over a socket, or hand-built frames (``RawClient``) for what h2
will not send (protocol errors, CONTINUATION, more streams than allowed, frames after GOAWAY).
"""

from __future__ import annotations

import asyncio
import gzip
import struct
import zlib
from collections.abc import AsyncIterator, Callable

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from google.protobuf.wrappers_pb2 import BytesValue
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from services.gateway.grpc.http2.calls import CallLimits
from services.gateway.grpc.http2.connection import Http2Settings
from services.gateway.grpc.http2.server import Server
from tests.integration.http2_support import (
    ACK,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    LIMITS,
    PADDED,
    SERVICE,
    WAIT_S,
    Kind,
    Probe,
    RawClient,
    Serve,
    Served,
    h2_client,
    message,
    messages,
    raw_client,
    register,
    request_headers,
)

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def probe() -> Probe:
    return Probe()


@pytest.fixture
async def serve(probe: Probe) -> AsyncIterator[Serve]:
    """Start a ``Server`` on 127.0.0.1 (a free port) with the probe; stopped after the test."""
    servers: list[Server] = []

    async def start(http2: Http2Settings | None = None, limits: CallLimits = LIMITS) -> Served:
        server = Server(http2 or Http2Settings(), limits)
        register(server, probe)
        port = await server.start("127.0.0.1", 0)
        servers.append(server)
        return Served(server, port)

    yield start
    for server in servers:
        await server.stop(0)


@pytest.fixture
async def port(serve: Serve) -> int:
    return (await serve()).port


# --- h2 client ------------------------------------------------------------------------------------
class TestConnection:
    async def test_server_advertises_its_settings_and_receive_windows(self, serve: Serve) -> None:
        settings = Http2Settings(
            stream_window=100_000,
            connection_window=1 << 20,
            max_concurrent_streams=7,
            max_frame_size=32_768,
            max_header_list_size=8192,
        )
        served = await serve(settings)
        async with raw_client(served.port) as client:
            first = await client.wait_for(lambda f: True)
            update = await client.wait_for(lambda f: f.kind == Kind.WINDOW_UPDATE)
        assert (first.kind, first.flags) == (Kind.SETTINGS, 0)
        pairs = dict(struct.iter_unpack(">HI", first.payload))
        assert pairs == {
            SettingCodes.MAX_CONCURRENT_STREAMS: 7,
            SettingCodes.INITIAL_WINDOW_SIZE: 100_000,
            SettingCodes.MAX_FRAME_SIZE: 32_768,
            SettingCodes.MAX_HEADER_LIST_SIZE: 8192,
            SettingCodes.ENABLE_PUSH: 0,
        }
        assert (update.stream_id, struct.unpack(">I", update.payload)[0]) == (
            0,
            (1 << 20) - DEFAULT_WINDOW,
        )

    async def test_client_settings_are_acknowledged(self, port: int) -> None:
        async with h2_client(port, window=1000) as client:
            await client.wait_for(lambda e: isinstance(e, h2.events.SettingsAcknowledged))

    async def test_ping_is_answered_with_the_same_payload(self, port: int) -> None:
        async with h2_client(port) as client:
            client.conn.ping(b"\x00\x01\x02\x03\xfc\xfd\xfe\xff")
            client.flush()
            ack = await client.wait_for(lambda e: isinstance(e, h2.events.PingAckReceived))
        assert isinstance(ack, h2.events.PingAckReceived)
        assert ack.ping_data == b"\x00\x01\x02\x03\xfc\xfd\xfe\xff"

    async def test_a_busy_stock_client_stays_within_every_flood_budget(self, port: int) -> None:
        """The grpcio client at c=64 on bidi streams, as tritonclient's ModelStreamInfer: it
        sends a WINDOW_UPDATE per message it reads and BDP PINGs as data arrives, tens of
        thousands a second, all earned by the answers (``budgets.py``); no GOAWAY."""
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            chat = channel.stream_stream(
                f"/{SERVICE}/Chat",
                request_serializer=BytesValue.SerializeToString,
                response_deserializer=BytesValue.FromString,
            )

            async def session(n: int) -> int:
                call = chat(timeout=60)
                got = 0
                for _ in range(n):
                    await call.write(BytesValue(value=b"ping"))
                    got += (await call.read()).value == b"PING"
                await call.done_writing()
                assert await call.read() is grpc.aio.EOF
                return got

            answered = await asyncio.gather(*(session(400) for _ in range(64)))
        assert answered == [400] * 64


# --- calls ----------------------------------------------------------------------------------------


class TestCalls:
    async def test_unary_call_is_headers_one_message_and_ok_trailers(self, port: int) -> None:
        async with h2_client(port) as client:
            stream_id = client.start("Echo", message(b"hello"))
            response = await client.response(stream_id)
            frames = client.data_frames(stream_id)
        assert response.headers == [(b":status", b"200"), (b"content-type", b"application/grpc")]
        assert (len(frames), messages(response.data)) == (1, [b"hello"])
        assert response.trailers == [(b"grpc-status", b"0")]

    async def test_bidi_stream_answers_each_message(self, port: int) -> None:
        async with h2_client(port) as client:
            stream_id = client.start("Chat", message(b"a") + message(b"b"), end_stream=False)
            await client.wait_for(
                lambda e: isinstance(e, h2.events.DataReceived) and len(e.data or b"") > 0
            )
            await client.send(stream_id, message(b"c"), end_stream=True)
            response = await client.response(stream_id)
        assert (messages(response.data), response.grpc_status) == ([b"A", b"B", b"C"], 0)

    async def test_metadata_reaches_the_method_and_bin_values_are_decoded(self, port: int) -> None:
        extra = [(b"x-user", b"alice"), (b"x-trace-bin", b"AP8"), (b"grpc-timeout", b"10S")]
        async with h2_client(port) as client:
            headers = request_headers("Metadata", extra=extra)
            response = await client.call("Metadata", message(b""), headers=headers)
        lines = messages(response.data)[0].decode().splitlines()
        assert "x-user='alice'" in lines
        assert "x-trace-bin=b'\\x00\\xff'" in lines
        assert not [line for line in lines if line.startswith(("grpc-timeout", "te=", ":"))]

    async def test_abort_sends_status_percent_encoded_message_and_metadata(self, port: int) -> None:
        async with h2_client(port) as client:
            response = await client.call("Abort", message(b""))
        assert response.trailers == []  # trailers-only: nothing was sent before
        assert response.headers == [
            (b":status", b"200"),
            (b"content-type", b"application/grpc"),
            (b"grpc-status", b"3"),
            (b"grpc-message", b"h%C3%A9llo %25"),
            (b"x-reason", b"why"),
            (b"x-blob-bin", b"AP8"),
        ]

    async def test_abort_after_messages_ends_with_trailers(self, port: int) -> None:
        async with h2_client(port) as client:
            response = await client.call("Repeat", message(b"2:3:abort"))
        assert response.headers == [(b":status", b"200"), (b"content-type", b"application/grpc")]
        assert messages(response.data) == [b"\x00" * 3, b"\x01" * 3]
        assert response.trailers == [
            (b"grpc-status", b"15"),
            (b"grpc-message", b"after writes"),
            (b"x-at", b"end"),
        ]

    async def test_exception_in_the_method_is_unknown(self, port: int) -> None:
        async with h2_client(port) as client:
            response = await client.call("Crash", message(b""))
        assert response.grpc_status == grpc.StatusCode.UNKNOWN.value[0]
        assert b"boom" in response.grpc[b"grpc-message"]

    async def test_each_request_hands_out_messages_as_they_come(self, port: int) -> None:
        async with h2_client(port) as client:
            body = message(b"abc") + message(b"xy") + message(b"")
            response = await client.call("Each", body)
        assert sorted(messages(response.data)) == [b"", b"cba", b"yx"]
        assert response.grpc_status == 0

    async def test_each_request_with_an_unparsable_message_fails_the_call(self, port: int) -> None:
        async with h2_client(port) as client:
            response = await client.call("Each", message(b"ok") + b"\x00\x00\x00\x00\x02\xff\xff")
        assert response.grpc_status == grpc.StatusCode.INTERNAL.value[0]


class TestRejectedRequests:
    async def test_unknown_method_is_trailers_only_unimplemented(self, port: int) -> None:
        async with h2_client(port) as client:
            stream_id = client.start("Nope", message(b""))
            response = await client.response(stream_id)
            first = await client.wait_for(lambda e: isinstance(e, h2.events.ResponseReceived))
        assert isinstance(first, h2.events.ResponseReceived)
        assert first.stream_ended is not None  # one HEADERS frame, with END_STREAM
        assert (response.data, response.trailers) == (b"", [])
        assert response.headers == [
            (b":status", b"200"),
            (b"content-type", b"application/grpc"),
            (b"grpc-status", b"12"),
            (b"grpc-message", b"Method not found!"),
        ]

    async def test_non_post_is_405(self, port: int) -> None:
        async with h2_client(port) as client:
            response = await client.call("Echo", b"", headers=request_headers("Echo", verb=b"GET"))
        assert (response.status, response.trailers) == (b"405", [])

    @pytest.mark.parametrize(
        "content_type", [b"text/plain", b"application/grpc-web", b"application/grpcx"]
    )
    async def test_non_grpc_content_type_is_415(self, port: int, content_type: bytes) -> None:
        headers = request_headers("Echo", content_type=content_type)
        async with h2_client(port) as client:
            response = await client.call("Echo", message(b"x"), headers=headers)
        assert response.status == b"415"

    @pytest.mark.parametrize(
        "content_type", [b"application/grpc", b"application/grpc+proto", b"application/grpc;x=1"]
    )
    async def test_grpc_content_types_are_served(self, port: int, content_type: bytes) -> None:
        headers = request_headers("Echo", content_type=content_type)
        async with h2_client(port) as client:
            response = await client.call("Echo", message(b"x"), headers=headers)
        assert (response.grpc_status, messages(response.data)) == (0, [b"x"])

    async def test_unsupported_encoding_is_unimplemented(self, port: int) -> None:
        headers = request_headers("Echo", extra=[(b"grpc-encoding", b"br")])
        async with h2_client(port) as client:
            response = await client.call("Echo", message(b"x"), headers=headers)
        assert response.grpc_status == grpc.StatusCode.UNIMPLEMENTED.value[0]

    @pytest.mark.parametrize(
        ("encoding", "compress"), [(b"gzip", gzip.compress), (b"deflate", zlib.compress)]
    )
    async def test_compressed_request_is_decoded(
        self, port: int, encoding: bytes, compress: Callable[[bytes], bytes]
    ) -> None:
        payload = compress(BytesValue(value=b"squeeze me " * 100).SerializeToString())
        body = struct.pack(">BI", 1, len(payload)) + payload
        headers = request_headers("Echo", extra=[(b"grpc-encoding", encoding)])
        async with h2_client(port) as client:
            response = await client.call("Echo", body, headers=headers)
        assert (response.grpc_status, messages(response.data)) == (0, [b"squeeze me " * 100])

    async def test_message_over_max_receive_is_resource_exhausted(self, serve: Serve) -> None:
        served = await serve(limits=CallLimits(max_receive=1024, max_send=1024))
        async with h2_client(served.port) as client:
            response = await client.call("Echo", message(b"x" * 2000))
        assert response.grpc_status == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]

    async def test_compressed_message_inflating_over_max_receive_is_resource_exhausted(
        self, serve: Serve
    ) -> None:
        """The limit is on the message, not on its compressed bytes (no gzip bombs)."""
        served = await serve(limits=CallLimits(max_receive=1024, max_send=1 << 20))
        payload = gzip.compress(BytesValue(value=bytes(200_000)).SerializeToString())
        body = struct.pack(">BI", 1, len(payload)) + payload
        headers = request_headers("Echo", extra=[(b"grpc-encoding", b"gzip")])
        async with h2_client(served.port) as client:
            response = await client.call("Echo", body, headers=headers)
        assert response.grpc_status == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


class TestCancellation:
    async def test_deadline_cancels_the_method_and_answers_deadline_exceeded(
        self, port: int, probe: Probe
    ) -> None:
        headers = request_headers("Sleep", extra=[(b"grpc-timeout", b"100m")])
        async with h2_client(port) as client:
            response = await client.call("Sleep", message(b""), headers=headers)
        assert response.grpc_status == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        assert probe.sleep_cancelled.is_set()

    async def test_deadline_ends_a_stream_stuck_on_the_clients_window(self, port: int) -> None:
        """The client grants 1000 bytes of a 5 kB message and no more: the deadline still ends
        the call, with RST_STREAM(CANCEL), as trailers after part of a message would be a
        malformed response (the client's own deadline names the status)."""
        headers = request_headers("Repeat", extra=[(b"grpc-timeout", b"200m")])
        async with h2_client(port, window=1000, is_auto_ack=False) as client:
            response = await client.call("Repeat", message(b"1:5000"), headers=headers)
        assert len(response.data) == 1000
        assert (response.trailers, response.reset) == ([], ErrorCodes.CANCEL)

    async def test_client_reset_cancels_that_call_and_others_go_on(
        self, port: int, probe: Probe
    ) -> None:
        async with h2_client(port) as client:
            sleeping = client.start("Sleep", message(b""))
            gated = client.start("Gate", message(b"still here"))
            async with asyncio.timeout(WAIT_S):
                await probe.sleep_entered.wait()
                await probe.gate_entered.wait()
            client.conn.reset_stream(sleeping, ErrorCodes.CANCEL)
            client.flush()
            async with asyncio.timeout(WAIT_S):
                await probe.sleep_ended.wait()
            probe.gate.set()
            response = await client.response(gated)
        assert probe.sleep_cancelled.is_set()
        assert (response.grpc_status, messages(response.data)) == (0, [b"still here"])


# --- flow control ---------------------------------------------------------------------------------


class TestSendFlowControl:
    async def test_large_response_goes_out_as_the_client_grants_windows(self, port: int) -> None:
        """Client stream window 1000, frames of 16 KiB at most: the server sends 1000 bytes,
        stops, sends 500 more when granted 500, and the rest in frames no larger than 16 KiB."""
        async with h2_client(port, window=1000, is_auto_ack=False) as client:
            stream_id = client.start("Sized", message(b"40000"))
            await client.wait_for(lambda e: isinstance(e, h2.events.DataReceived))
            await client.barrier()
            first = sum(e.flow_controlled_length or 0 for e in client.data_frames(stream_id))

            mark = len(client.events)
            client.conn.increment_flow_control_window(500, stream_id)
            client.flush()
            await client.wait_for(lambda e: isinstance(e, h2.events.DataReceived), since=mark)
            await client.barrier()
            second = sum(e.flow_controlled_length or 0 for e in client.data_frames(stream_id))

            client.conn.increment_flow_control_window(100_000, stream_id)
            client.conn.increment_flow_control_window(100_000)
            client.flush()
            response = await client.response(stream_id)
            sizes = [e.flow_controlled_length or 0 for e in client.data_frames(stream_id)]
        assert (first, second) == (1000, 1500)
        assert max(sizes) == 16_384
        assert len(sizes) >= 4
        assert messages(response.data) == [bytes(i % 251 for i in range(40_000))]
        assert response.grpc_status == 0

    async def test_concurrent_writers_under_a_small_window_keep_messages_whole(
        self, port: int
    ) -> None:
        """Four tasks write 3 kB messages at once through a 1000-byte window, granted in small
        steps: each message arrives whole, none cut into another."""
        async with h2_client(port, window=1000, is_auto_ack=False) as client:
            stream_id = client.start("FanOut", message(b"4:3000"))
            for _ in range(40):
                await client.barrier()
                if any(isinstance(e, h2.events.StreamEnded) for e in client.events):
                    break
                client.conn.increment_flow_control_window(700, stream_id)
                client.conn.increment_flow_control_window(700)
                client.flush()
            response = await client.response(stream_id)
        assert sorted(messages(response.data)) == [bytes((i,)) * 3000 for i in range(4)]
        assert response.grpc_status == 0

    async def test_settings_raising_the_initial_window_resume_a_blocked_response(
        self, port: int
    ) -> None:
        async with h2_client(port, window=1000, is_auto_ack=False) as client:
            stream_id = client.start("Sized", message(b"40000"))
            await client.wait_for(lambda e: isinstance(e, h2.events.DataReceived))
            client.conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 60_000})
            client.flush()
            response = await client.response(stream_id)
        assert (response.grpc_status, len(messages(response.data)[0])) == (0, 40_000)

    async def test_response_waits_for_the_connection_window_too(self, port: int) -> None:
        async with h2_client(port, is_auto_ack=False) as client:
            client.conn.increment_flow_control_window(1 << 20, None)  # streams: conn. window only
            stream_id = client.start("Sized", message(b"100000"))
            await client.wait_for(lambda e: isinstance(e, h2.events.DataReceived))
            await client.barrier()
            before = sum(e.flow_controlled_length or 0 for e in client.data_frames(stream_id))
            client.conn.increment_flow_control_window(1 << 20, stream_id)
            client.flush()
            response = await client.response(stream_id)
        assert before == DEFAULT_WINDOW
        assert len(messages(response.data)[0]) == 100_000


class TestReceiveFlowControl:
    async def test_windows_are_given_back_as_the_method_reads(
        self, serve: Serve, probe: Probe
    ) -> None:
        """Both windows come back in WINDOW_UPDATEs, or 100 kB could not get through them. A
        connection window below the default (which SETTINGS cannot lower) settles there."""
        served = await serve(Http2Settings(stream_window=4096, connection_window=8192))
        probe.may_read.set()
        body = b"".join(message(bytes(1000)) for _ in range(100))
        async with h2_client(served.port) as client:
            stream_id = client.start("Collect", end_stream=False)
            await client.send(stream_id, body, end_stream=True)
            response = await client.response(stream_id)
            await client.barrier()
            connection_window = client.conn.outbound_flow_control_window
            stream_updates = client.window_updates(stream_id)
            connection_updates = client.window_updates(0)
        assert messages(response.data) == [b"100000"]
        assert sum(stream_updates) >= len(body) - 4096
        assert sum(connection_updates) >= len(body) - DEFAULT_WINDOW
        assert 4096 < connection_window <= 8192

    async def test_method_that_does_not_read_holds_the_window(
        self, serve: Serve, probe: Probe
    ) -> None:
        served = await serve(Http2Settings(stream_window=4096))
        one = message(bytes(1000))
        async with h2_client(served.port) as client:
            stream_id = client.start("Collect", end_stream=False)
            sent = 0
            while client.conn.local_flow_control_window(stream_id) >= len(one):
                await client.send(stream_id, one)  # one DATA frame per message, as grpc does
                sent += 1
            mark = len(client.events)
            await client.barrier()
            held = client.window_updates(stream_id, since=0)

            probe.may_read.set()
            await client.wait_for(
                lambda e: isinstance(e, h2.events.WindowUpdated) and e.stream_id == stream_id,
                since=mark,
            )
            await client.send(stream_id, one * 6, end_stream=True)
            response = await client.response(stream_id)
        assert (sent, held) == (4, [])
        assert messages(response.data) == [str((sent + 6) * 1000).encode()]

    async def test_data_before_the_settings_ack_may_use_the_default_window(
        self, serve: Serve, probe: Probe
    ) -> None:
        """A client may send before it has read the server's SETTINGS (grpc clients do): until
        it acknowledges them, the stream window it goes by is the default 65,535."""
        served = await serve(Http2Settings(stream_window=4096))
        probe.may_read.set()
        async with raw_client(served.port) as client:
            client.send_headers(1, request_headers("Collect"))
            body = message(bytes(60_000))  # in frames of the default maximum, 16 KiB
            for i in range(0, len(body), 16_384):
                end = END_STREAM if i + 16_384 >= len(body) else 0
                client.send(Kind.DATA, end, 1, body[i : i + 16_384])
            response = await client.response(1)
        assert (response.grpc_status, messages(response.data)) == (0, [b"60000"])

    async def test_connection_window_below_the_default_still_allows_the_default(
        self, serve: Serve
    ) -> None:
        """The connection window starts at 65,535 and SETTINGS cannot lower it."""
        served = await serve(Http2Settings(connection_window=4096))
        async with h2_client(served.port) as client:
            response = await client.call("Echo", message(bytes(60_000)))
        assert (response.grpc_status, len(messages(response.data)[0])) == (0, 60_000)


class TestRawRequests:
    async def test_request_in_padded_data_frames_after_headers_and_continuations(
        self, port: int
    ) -> None:
        async with raw_client(port) as client:
            headers = request_headers("Echo", extra=[(b"x-filler", b"f" * 300)])
            block = client.encoder.encode(headers)
            third = len(block) // 3
            client.send(Kind.HEADERS, 0, 1, block[:third])
            client.send(Kind.CONTINUATION, 0, 1, block[third : 2 * third])
            client.send(Kind.CONTINUATION, END_HEADERS, 1, block[2 * third :])
            body = message(bytes(range(256)) * 12)
            pieces = [body[:3], body[3:1000], body[1000:2000], body[2000:]]
            for i, (piece, pad) in enumerate(zip(pieces, [0, 7, 255, 1], strict=True)):
                flags = PADDED | (END_STREAM if i == len(pieces) - 1 else 0)
                client.send(Kind.DATA, flags, 1, bytes((pad,)) + piece + b"\x00" * pad)
            response = await client.response(1)
        assert (response.grpc_status, messages(response.data)) == (0, [bytes(range(256)) * 12])

    async def test_request_trailers_end_it_and_priority_and_unknown_frames_are_ignored(
        self, port: int
    ) -> None:
        async with raw_client(port) as client:
            client.send(0xAA, 0xFF, 0, b"an extension frame")
            client.send(Kind.PRIORITY, 0, 1, struct.pack(">IB", 0, 15))
            client.send_headers(1, request_headers("Echo"))
            client.send(0xAA, 0, 1, b"another")
            client.send(Kind.DATA, 0, 1, message(b"tail"))
            client.send_headers(1, [(b"x-client-trailer", b"1")], end_stream=True)
            response = await client.response(1)
        assert (response.grpc_status, messages(response.data)) == (0, [b"tail"])

    async def test_trailers_over_the_peers_frame_size_go_out_with_continuations(
        self, port: int
    ) -> None:
        async with raw_client(port) as client:
            client.send_call(1, "BigTrailers", message(b"ok"))
            response = await client.response(1)
        last = [f for f in client.frames if f.stream_id == 1][-1]
        assert (last.kind, last.continuations, len(last.payload)) == (Kind.HEADERS, 2, 16_384)
        assert response.trailers == [
            (b"grpc-status", b"0"),
            (b"x-big", b"b" * 40_000),
            (b"x-small", b"s"),
        ]

    async def test_client_goaway_lets_open_calls_finish_then_closes(
        self, port: int, probe: Probe
    ) -> None:
        async with raw_client(port) as client:
            client.send_call(1, "Gate", message(b"last"))
            async with asyncio.timeout(WAIT_S):
                await probe.gate_entered.wait()
            client.send(Kind.GOAWAY, 0, 0, struct.pack(">II", 0, ErrorCodes.NO_ERROR))
            await client.ping()
            probe.gate.set()
            response = await client.response(1)
            await client.until_closed()
        assert (response.grpc_status, messages(response.data)) == (0, [b"last"])

    async def test_streams_over_the_concurrency_limit_are_refused(
        self, serve: Serve, probe: Probe
    ) -> None:
        served = await serve(Http2Settings(max_concurrent_streams=2))
        async with raw_client(served.port) as client:
            for stream_id in (1, 3, 5):
                client.send_call(stream_id, "Gate", message(str(stream_id).encode()))
            refused = await client.reset(5)
            probe.gate.set()
            first, second = await client.response(1), await client.response(3)
        assert refused.code == ErrorCodes.REFUSED_STREAM
        assert (messages(first.data), messages(second.data)) == ([b"1"], [b"3"])

    async def test_data_beyond_the_stream_window_resets_only_that_stream(
        self, serve: Serve
    ) -> None:
        served = await serve(Http2Settings(stream_window=1024))
        async with raw_client(served.port) as client:
            await client.wait_for(lambda f: f.kind == Kind.SETTINGS)
            client.send(Kind.SETTINGS, ACK, 0)
            client.send_headers(1, request_headers("Collect"))
            client.send(Kind.DATA, 0, 1, message(bytes(2000)))
            reset = await client.reset(1)
            await client.ping()
        assert reset.code == ErrorCodes.FLOW_CONTROL_ERROR


# --- connection errors ----------------------------------------------------------------------------


def _headers_on_even_stream(client: RawClient) -> None:
    client.send_headers(2, request_headers("Echo"), end_stream=True)


def _data_on_stream_zero(client: RawClient) -> None:
    client.send(Kind.DATA, 0, 0, b"xyz")


def _frame_over_max_size(client: RawClient) -> None:
    client.send_bytes(struct.pack(">IBI", 16_385 << 8 | Kind.DATA, 0, 1))  # the header is enough


def _window_update_past_2_31(client: RawClient) -> None:
    client.send(Kind.WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1))


async def test_a_connection_that_never_sends_the_preface_is_closed(serve: Serve) -> None:
    served = await serve(Http2Settings(preface_timeout_s=0.2))
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        async with asyncio.timeout(WAIT_S):
            while await reader.read(65_536):  # the server's SETTINGS, then EOF
                pass
    finally:
        writer.close()


class TestConnectionErrors:
    async def test_bad_preface_is_goaway_protocol_error(self, port: int) -> None:
        async with raw_client(port, preface=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") as client:
            frames = await client.until_closed()
        assert [(f.kind, f.code) for f in frames if f.kind == Kind.GOAWAY] == [
            (Kind.GOAWAY, ErrorCodes.PROTOCOL_ERROR)
        ]

    @pytest.mark.parametrize(
        ("send", "code"),
        [
            (_data_on_stream_zero, ErrorCodes.PROTOCOL_ERROR),
            (_headers_on_even_stream, ErrorCodes.PROTOCOL_ERROR),
            (_frame_over_max_size, ErrorCodes.FRAME_SIZE_ERROR),
            (_window_update_past_2_31, ErrorCodes.FLOW_CONTROL_ERROR),
        ],
        ids=["data-on-stream-0", "even-stream-id", "frame-too-large", "window-overflow"],
    )
    async def test_protocol_error_is_goaway_and_close(
        self, serve: Serve, send: Callable[[RawClient], None], code: ErrorCodes
    ) -> None:
        served = await serve(Http2Settings(max_frame_size=16_384))
        async with raw_client(served.port) as client:
            await client.ping()
            send(client)
            frames = await client.until_closed()
        assert [f.code for f in frames if f.kind == Kind.GOAWAY] == [code]


# --- stopping -------------------------------------------------------------------------------------


class TestStop:
    async def test_goaway_then_in_flight_call_finishes_and_new_streams_are_refused(
        self, serve: Serve, probe: Probe
    ) -> None:
        served = await serve()
        async with raw_client(served.port) as client:
            client.send_call(1, "Gate", message(b"in flight"))
            async with asyncio.timeout(WAIT_S):
                await probe.gate_entered.wait()
            stopping = asyncio.get_running_loop().create_task(served.server.stop(10))
            goaway = await client.goaway()
            client.send_call(3, "Echo", message(b"too late"))
            refused = await client.reset(3)
            probe.gate.set()
            response = await client.response(1)
            await client.until_closed()
            async with asyncio.timeout(WAIT_S):
                await stopping  # well before the grace period
        assert (struct.unpack_from(">I", goaway.payload)[0], goaway.code) == (1, 0)
        assert refused.code == ErrorCodes.REFUSED_STREAM
        assert (response.grpc_status, messages(response.data)) == (0, [b"in flight"])

    async def test_call_still_running_after_grace_is_cancelled(
        self, serve: Serve, probe: Probe
    ) -> None:
        served = await serve()
        async with raw_client(served.port) as client:
            client.send_call(1, "Sleep", message(b""))
            async with asyncio.timeout(WAIT_S):
                await probe.sleep_entered.wait()
                await served.server.stop(0.2)
            frames = await client.until_closed()
        assert probe.sleep_cancelled.is_set()
        assert [f.code for f in frames if f.kind == Kind.GOAWAY][:1] == [ErrorCodes.NO_ERROR]

    async def test_stopped_server_takes_no_connections(self, serve: Serve) -> None:
        served = await serve()
        await served.server.stop(1)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", served.port)
