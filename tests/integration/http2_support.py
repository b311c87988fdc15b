"""Raw HTTP/2 clients (``h2``'s state machine, and hand-built frames) and a probe servicer, for
the tests of the gateway's own gRPC server (``test_http2_server.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
from google.protobuf.wrappers_pb2 import BytesValue
from h2.settings import SettingCodes

from services.gateway.grpc.http2.calls import CallLimits
from services.gateway.grpc.http2.connection import Http2Settings
from services.gateway.grpc.http2.server import Server

SERVICE = "test.Probe"
LIMITS = CallLimits(max_receive=1 << 20, max_send=4 << 20)
WAIT_S = 5.0
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_WINDOW = 65_535
Headers = list[tuple[bytes, bytes]]


class Kind(IntEnum):
    """Frame types (RFC 9113 §6), written out here rather than taken from the server."""

    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20


# --- gRPC framing ---------------------------------------------------------------------------------


def message(value: bytes) -> bytes:
    """A ``BytesValue`` as one length-prefixed gRPC message, uncompressed."""
    data = BytesValue(value=value).SerializeToString()
    return struct.pack(">BI", 0, len(data)) + data


def messages(data: bytes) -> list[bytes]:
    """The ``BytesValue`` payloads of a stream of length-prefixed messages."""
    out, pos = [], 0
    while pos < len(data):
        flag, length = struct.unpack_from(">BI", data, pos)
        assert flag == 0
        out.append(BytesValue.FromString(data[pos + 5 : pos + 5 + length]).value)
        pos += 5 + length
    return out


def request_headers(
    method: str,
    *,
    verb: bytes = b"POST",
    content_type: bytes = b"application/grpc",
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> Headers:
    return [
        (b":method", verb),
        (b":scheme", b"http"),
        (b":path", f"/{SERVICE}/{method}".encode()),
        (b":authority", b"127.0.0.1"),
        (b"content-type", content_type),
        (b"te", b"trailers"),
        *extra,
    ]


@dataclass(frozen=True)
class Response:
    headers: Headers
    data: bytes
    trailers: Headers
    reset: int | None = None

    @property
    def status(self) -> bytes | None:
        return dict(self.headers).get(b":status")

    @property
    def grpc(self) -> dict[bytes, bytes]:
        """The gRPC status fields: from the trailers, or the headers of a trailers-only reply."""
        return dict(self.trailers or self.headers)

    @property
    def grpc_status(self) -> int:
        return int(self.grpc[b"grpc-status"])


# --- the probe servicer ---------------------------------------------------------------------------


class Context(Protocol):
    """The part of ``grpc.aio.ServicerContext`` the probe uses."""

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any) -> None: ...

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]: ...

    def set_trailing_metadata(self, trailing_metadata: Any) -> None: ...

    async def write(self, message: Any) -> None: ...

    async def each_request(self, start: Callable[[Any], None]) -> None: ...


class Probe:
    """A servicer whose methods say what happened to them."""

    def __init__(self) -> None:
        self.sleep_entered = asyncio.Event()
        self.sleep_cancelled = asyncio.Event()
        self.sleep_ended = asyncio.Event()
        self.gate_entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.may_read = asyncio.Event()

    async def echo(self, request: BytesValue, context: Context) -> BytesValue:
        return request

    async def sized(self, request: BytesValue, context: Context) -> BytesValue:
        """A reply of ``int(request.value)`` bytes, in a pattern that shows order."""
        return BytesValue(value=bytes(i % 251 for i in range(int(request.value))))

    async def sleep(self, request: BytesValue, context: Context) -> BytesValue:
        self.sleep_entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.sleep_cancelled.set()
            raise
        finally:
            self.sleep_ended.set()
        return request

    async def wait_gate(self, request: BytesValue, context: Context) -> BytesValue:
        self.gate_entered.set()
        await self.gate.wait()
        return request

    async def abort(self, request: BytesValue, context: Context) -> BytesValue:
        metadata = (("x-reason", "why"), ("x-blob-bin", b"\x00\xff"))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "héllo %", metadata)
        raise AssertionError("abort returned")

    async def crash(self, request: BytesValue, context: Context) -> BytesValue:
        raise RuntimeError("boom")

    async def big_trailers(self, request: BytesValue, context: Context) -> BytesValue:
        context.set_trailing_metadata((("x-big", "b" * 40_000), ("x-small", "s")))
        return request

    async def metadata(self, request: BytesValue, context: Context) -> BytesValue:
        """The invocation metadata, one ``key=repr(value)`` line each."""
        lines = [f"{key}={value!r}" for key, value in context.invocation_metadata()]
        return BytesValue(value="\n".join(lines).encode())

    async def repeat(self, request: BytesValue, context: Context) -> AsyncIterator[BytesValue]:
        """``value`` is ``count:size``: that many messages of that size; then it aborts if a
        third field says so."""
        count, size, *aborting = request.value.split(b":")
        for i in range(int(count)):
            yield BytesValue(value=bytes((i,)) * int(size))
        if aborting:
            await context.abort(grpc.StatusCode.DATA_LOSS, "after writes", (("x-at", "end"),))

    async def fan_out(self, request: BytesValue, context: Context) -> None:
        """``value`` is ``count:size``: that many tasks, each writing one message of that size
        (bytes of its index) at the same time."""
        count, size = map(int, request.value.split(b":"))

        async def one(i: int) -> None:
            await context.write(BytesValue(value=bytes((i,)) * size))

        await asyncio.gather(*(one(i) for i in range(count)))

    async def each(self, requests: AsyncIterator[BytesValue], context: Context) -> None:
        """Every request answered by its own task (``each_request``), reversed."""
        tasks: list[asyncio.Task[None]] = []

        def start(request: BytesValue) -> None:
            reply = BytesValue(value=request.value[::-1])
            tasks.append(asyncio.get_running_loop().create_task(context.write(reply)))

        await context.each_request(start)
        await asyncio.gather(*tasks)

    async def collect(self, requests: AsyncIterator[BytesValue], context: Context) -> BytesValue:
        """Reads nothing until ``may_read``; then the total size of what was sent."""
        await self.may_read.wait()
        total = sum([len(request.value) async for request in requests])
        return BytesValue(value=str(total).encode())

    async def chat(
        self, requests: AsyncIterator[BytesValue], context: Context
    ) -> AsyncIterator[BytesValue]:
        async for request in requests:
            yield BytesValue(value=request.value.upper())


def _bytes_values(kind: Callable[..., Any], fn: Callable[..., Any]) -> Any:
    """A method handler of ``kind`` for ``fn``, with ``BytesValue`` requests and responses."""
    return kind(
        fn,
        request_deserializer=BytesValue.FromString,
        response_serializer=BytesValue.SerializeToString,
    )


def _unary(fn: Callable[..., Awaitable[BytesValue]]) -> grpc.RpcMethodHandler[Any, Any]:
    handler: grpc.RpcMethodHandler[Any, Any] = _bytes_values(
        grpc.unary_unary_rpc_method_handler, fn
    )
    return handler


def register(server: Server, probe: Probe) -> None:
    """Unary methods the way generated code registers them; streaming ones as a generic handler."""
    server.add_registered_method_handlers(
        SERVICE,
        {
            "Echo": _unary(probe.echo),
            "Sized": _unary(probe.sized),
            "Sleep": _unary(probe.sleep),
            "Gate": _unary(probe.wait_gate),
            "Abort": _unary(probe.abort),
            "Crash": _unary(probe.crash),
            "Metadata": _unary(probe.metadata),
            "BigTrailers": _unary(probe.big_trailers),
        },
    )
    streaming = {
        "Collect": _bytes_values(grpc.stream_unary_rpc_method_handler, probe.collect),
        "Repeat": _bytes_values(grpc.unary_stream_rpc_method_handler, probe.repeat),
        "FanOut": _bytes_values(grpc.unary_stream_rpc_method_handler, probe.fan_out),
        "Chat": _bytes_values(grpc.stream_stream_rpc_method_handler, probe.chat),
        "Each": _bytes_values(grpc.stream_stream_rpc_method_handler, probe.each),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, streaming)])


@dataclass(frozen=True)
class Served:
    server: Server
    port: int


class Serve(Protocol):
    async def __call__(
        self, http2: Http2Settings | None = None, limits: CallLimits = LIMITS
    ) -> Served: ...


class H2Client:
    """h2's client state machine over a socket; every event it reads is kept, in order."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        window: int | None,
        is_auto_ack: bool,
    ) -> None:
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config)
        if window is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={SettingCodes.INITIAL_WINDOW_SIZE: window}
            )
        self.conn.initiate_connection()
        self.events: list[h2.events.Event] = []
        self.error: Exception | None = None
        self.is_closed = False
        self._reader, self._writer = reader, writer
        self._is_auto_ack = is_auto_ack
        self._changed = asyncio.Condition()
        self.flush()
        self._task = asyncio.get_running_loop().create_task(self._read())

    def flush(self) -> None:
        if data := self.conn.data_to_send():
            self._writer.write(data)

    async def _read(self) -> None:
        try:
            while data := await self._reader.read(1 << 16):
                events = self.conn.receive_data(data)
                for event in events:
                    if isinstance(event, h2.events.DataReceived) and self._is_auto_ack:
                        assert event.stream_id is not None
                        size = event.flow_controlled_length or 0
                        self.conn.acknowledge_received_data(size, event.stream_id)
                self.flush()
                async with self._changed:
                    self.events.extend(events)
                    self._changed.notify_all()
        except Exception as exc:
            self.error = exc  # e.g. h2 saw the server overrun a window
        finally:
            async with self._changed:
                self.is_closed = True
                self._changed.notify_all()

    async def wait_for(
        self, predicate: Callable[[h2.events.Event], bool], *, since: int = 0
    ) -> h2.events.Event:
        """The first event from index ``since`` on that matches, read so far or next."""
        async with asyncio.timeout(WAIT_S), self._changed:
            while True:
                for event in self.events[since:]:
                    if predicate(event):
                        return event
                if self.error is not None:
                    raise AssertionError(f"the client failed: {self.error!r}")
                if self.is_closed:
                    raise AssertionError("the connection closed")
                await self._changed.wait()

    async def barrier(self) -> None:
        """A PING round trip: whatever the server sent before answering it has been read."""
        mark = len(self.events)
        self.conn.ping(b"barrier!")
        self.flush()
        await self.wait_for(lambda e: isinstance(e, h2.events.PingAckReceived), since=mark)

    def start(
        self,
        method: str,
        body: bytes = b"",
        *,
        headers: Headers | None = None,
        end_stream: bool = True,
    ) -> int:
        """Open a stream: headers, then ``body`` (framed messages) if any; its id."""
        stream_id: int = self.conn.get_next_available_stream_id()
        headers = request_headers(method) if headers is None else headers
        self.conn.send_headers(stream_id, headers, end_stream=end_stream and not body)
        size = self.conn.max_outbound_frame_size
        for i in range(0, len(body), size):  # within the windows: the caller's to make sure
            last = i + size >= len(body)
            self.conn.send_data(stream_id, body[i : i + size], end_stream=end_stream and last)
        self.flush()
        return stream_id

    async def send(self, stream_id: int, data: bytes, *, end_stream: bool = False) -> None:
        """All of ``data``, waiting for WINDOW_UPDATEs when the windows are spent."""
        while True:
            window = self.conn.local_flow_control_window(stream_id)
            size = min(window, self.conn.max_outbound_frame_size, len(data))
            if size or not data:
                chunk, data = data[:size], data[size:]
                self.conn.send_data(stream_id, chunk, end_stream=end_stream and not data)
                self.flush()
                if not data:
                    return
                continue
            mark = len(self.events)
            await self.wait_for(lambda e: isinstance(e, h2.events.WindowUpdated), since=mark)

    def window_updates(self, stream_id: int, *, since: int = 0) -> list[int]:
        return [
            e.delta or 0
            for e in self.events[since:]
            if isinstance(e, h2.events.WindowUpdated) and e.stream_id == stream_id
        ]

    def data_frames(self, stream_id: int) -> list[h2.events.DataReceived]:
        return [
            e
            for e in self.events
            if isinstance(e, h2.events.DataReceived) and e.stream_id == stream_id
        ]

    async def response(self, stream_id: int) -> Response:
        """The stream's response once it ended (or was reset)."""
        await self.wait_for(
            lambda e: (
                isinstance(e, h2.events.StreamEnded | h2.events.StreamReset)
                and e.stream_id == stream_id
            )
        )
        headers: Headers = []
        trailers: Headers = []
        data, reset = b"", None
        for e in self.events:
            if getattr(e, "stream_id", None) != stream_id:
                continue
            if isinstance(e, h2.events.ResponseReceived):
                headers = list(e.headers or [])
            elif isinstance(e, h2.events.TrailersReceived):
                trailers = list(e.headers or [])
            elif isinstance(e, h2.events.DataReceived):
                data += e.data or b""
            elif isinstance(e, h2.events.StreamReset) and reset is None:
                reset = e.error_code
        return Response(headers, data, trailers, reset)

    async def call(self, method: str, body: bytes, *, headers: Headers | None = None) -> Response:
        return await self.response(self.start(method, body, headers=headers))

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


@contextlib.asynccontextmanager
async def h2_client(
    port: int, *, window: int | None = None, is_auto_ack: bool = True
) -> AsyncIterator[H2Client]:
    """A connected client that has the server's SETTINGS (so its windows are the server's)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = H2Client(reader, writer, window=window, is_auto_ack=is_auto_ack)
    try:
        await client.wait_for(lambda e: isinstance(e, h2.events.RemoteSettingsChanged))
        yield client
    finally:
        await client.close()


# --- raw frames -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream_id: int
    payload: bytes
    headers: Headers | None = None
    """A HEADERS frame's decoded block (with its CONTINUATIONs)."""
    continuations: int = 0

    @property
    def code(self) -> int:
        """The error code of RST_STREAM or GOAWAY."""
        offset = 4 if self.kind == Kind.GOAWAY else 0
        return int(struct.unpack_from(">I", self.payload, offset)[0])


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", len(payload) << 8 | kind, flags, stream_id) + payload


class RawClient:
    """Hand-built frames out; frames in, one by one, all kept in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self.encoder = hpack.Encoder()
        self._decoder = hpack.Decoder()
        self.frames: list[Frame] = []
        self.is_closed = False

    def send(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        self._writer.write(frame(kind, flags, stream_id, payload))

    def send_bytes(self, data: bytes) -> None:
        self._writer.write(data)

    def send_headers(self, stream_id: int, headers: Headers, *, end_stream: bool = False) -> None:
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        self.send(Kind.HEADERS, flags, stream_id, self.encoder.encode(headers))

    def send_call(self, stream_id: int, method: str, body: bytes) -> None:
        self.send_headers(stream_id, request_headers(method))
        self.send(Kind.DATA, END_STREAM, stream_id, body)

    async def _read_frame(self) -> Frame | None:
        try:
            header = await self._reader.readexactly(9)
            length_kind, flags, stream_id = struct.unpack(">IBI", header)
            payload = await self._reader.readexactly(length_kind >> 8)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            return None
        return Frame(length_kind & 0xFF, flags, stream_id & 0x7FFFFFFF, payload)

    async def _next(self) -> Frame | None:
        """The next frame; a HEADERS frame joined with its CONTINUATIONs and decoded."""
        first = await self._read_frame()
        if first is None or first.kind != Kind.HEADERS:
            return first
        block, flags, count = self._block(first), first.flags, 0
        while not flags & END_HEADERS:
            more = await self._read_frame()
            assert more is not None
            assert (more.kind, more.stream_id) == (Kind.CONTINUATION, first.stream_id)
            block, flags, count = block + more.payload, more.flags, count + 1
        headers: Headers = self._decoder.decode(block, raw=True)  # type: ignore[assignment]
        return Frame(first.kind, first.flags, first.stream_id, first.payload, headers, count)

    @staticmethod
    def _block(headers: Frame) -> bytes:
        payload, start, end = headers.payload, 0, len(headers.payload)
        if headers.flags & PADDED:
            start, end = 1, end - payload[0]
        if headers.flags & PRIORITY_FLAG:
            start += 5
        return payload[start:end]

    async def wait_for(self, predicate: Callable[[Frame], bool], *, since: int = 0) -> Frame:
        """The first frame from index ``since`` on that matches, read so far or next."""
        async with asyncio.timeout(WAIT_S):
            for item in self.frames[since:]:
                if predicate(item):
                    return item
            while (read := await self._next()) is not None:
                self.frames.append(read)
                if predicate(read):
                    return read
        self.is_closed = True
        raise AssertionError(f"the connection closed; frames: {self.frames}")

    async def until_closed(self) -> list[Frame]:
        """Every frame until the server closes the connection."""
        async with asyncio.timeout(WAIT_S):
            while (item := await self._next()) is not None:
                self.frames.append(item)
        self.is_closed = True
        return self.frames

    async def goaway(self) -> Frame:
        return await self.wait_for(lambda f: f.kind == Kind.GOAWAY)

    async def reset(self, stream_id: int) -> Frame:
        return await self.wait_for(lambda f: f.kind == Kind.RST_STREAM and f.stream_id == stream_id)

    async def response(self, stream_id: int) -> Response:
        """The stream's response once it ended (END_STREAM or RST_STREAM)."""

        def is_end(f: Frame) -> bool:
            ends = f.kind == Kind.RST_STREAM or (
                f.kind in (Kind.HEADERS, Kind.DATA) and bool(f.flags & END_STREAM)
            )
            return f.stream_id == stream_id and ends

        await self.wait_for(is_end)
        blocks = [f.headers or [] for f in self.frames if f.stream_id == stream_id and f.headers]
        data = b"".join(
            f.payload for f in self.frames if f.stream_id == stream_id and f.kind == Kind.DATA
        )
        resets = [
            f.code for f in self.frames if f.stream_id == stream_id and f.kind == Kind.RST_STREAM
        ]
        headers, trailers = [*blocks, [], []][:2]
        return Response(headers, data, trailers, next(iter(resets), None))

    async def ping(self) -> None:
        """A PING round trip: the connection still answers."""
        mark = len(self.frames)
        self.send(Kind.PING, 0, 0, b"rawping!")
        ack = await self.wait_for(lambda f: f.kind == Kind.PING and f.flags & ACK > 0, since=mark)
        assert ack.payload == b"rawping!"

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


@contextlib.asynccontextmanager
async def raw_client(port: int, *, preface: bytes = PREFACE) -> AsyncIterator[RawClient]:
    """A connection that has sent ``preface`` and an empty SETTINGS frame."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = RawClient(reader, writer)
    client.send_bytes(preface)
    if preface == PREFACE:
        client.send(Kind.SETTINGS, 0, 0)
    try:
        yield client
    finally:
        await client.close()


# --- connection setup -----------------------------------------------------------------------------
