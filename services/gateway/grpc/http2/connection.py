"""One HTTP/2 server connection (RFC 9113) on the event loop: frames in, streams out.

It parses frames, keeps the stream table and both directions of flow control, answers SETTINGS
and PING, and hands each new request stream to ``on_request(stream, headers)``, which returns
the stream's ``StreamHandler`` (the gRPC call). It knows nothing of gRPC. Receive windows are
given back as the handler reports bytes consumed (``Stream.consumed``); sends wait for the
peer's windows and for the transport when it asks to pause.

While the transport asks to pause (the peer does not read what is written), no more frames are
read either: every frame the server writes unasked for flow control (PING and SETTINGS acks,
RST_STREAM, WINDOW_UPDATE, response headers and trailers) answers a frame read, so a peer that
sends without reading cannot grow the write buffer past the transport's high-water mark by
more than what one read brought in.

Errors follow RFC 9113 §5.4: a connection error sends GOAWAY and closes; a stream error sends
RST_STREAM and resets only that stream.

A client cannot make the server work for nothing (RFC 9113 §10.5): frames that ask for no
request (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, RST_STREAM, empty DATA and CONTINUATION,
unknown types) each have a flood budget (``budgets.py``), past which the connection ends with
GOAWAY ``ENHANCE_YOUR_CALM``; a SETTINGS frame is applied once whatever its length, and has at
most ``MAX_SETTINGS_ENTRIES``; a header block is at most ``max_header_block`` bytes and opens
with at most two table size updates (RFC 7541 §4.2); a WINDOW_UPDATE wakes only the streams it
lets send. A response that cannot go out within ``send_timeout_s`` (the client stopped reading,
or keeps its windows shut) resets its stream, and a connection without streams for
``idle_timeout_s`` is closed. ``docs/operations.md`` lists every limit.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

import hpack
import structlog

from services.gateway.grpc.http2.budgets import Budgets, Flood
from services.gateway.grpc.http2.frames import (
    DEFAULT_WINDOW,
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    MAX_FRAME_SIZE,
    MAX_WINDOW,
    MIN_FRAME_SIZE,
    PREFACE,
    TABLE_SIZE_ZERO,
    ErrorCode,
    Flag,
    FrameType,
    Setting,
    frame,
    frame_header,
    goaway,
    header_frames,
    leading_size_updates,
    parse_settings,
    rst_stream,
    settings_payload,
    window_update,
)

log = structlog.get_logger(__name__)

Headers = list[tuple[bytes, bytes]]
PREFACE_TIMEOUT_S = 10.0
LINGER_S = 2.0
"""How long a connection closed for an error still reads (and drops) what the client sends."""
MAX_SETTINGS_ENTRIES = 32
"""Entries of one SETTINGS frame (six identifiers are defined; a longer frame is a flood)."""
MAX_TABLE_SIZE_UPDATES = 2
"""Dynamic table size updates at the start of a header block (RFC 7541 §4.2)."""


@dataclass(frozen=True, slots=True)
class Http2Settings:
    """What the server advertises."""

    stream_window: int = 1 << 20
    """Initial receive window of each stream (SETTINGS_INITIAL_WINDOW_SIZE)."""
    connection_window: int = 16 << 20
    """Receive window of the connection (a WINDOW_UPDATE on stream 0 after SETTINGS)."""
    max_concurrent_streams: int = 1024
    max_frame_size: int = MIN_FRAME_SIZE
    """The largest frame a client may send (16 KiB, as grpc core; HTTP/2's smallest)."""
    max_header_list_size: int = 64 << 10
    max_header_block: int = 64 << 10
    """Bytes of one header block (HEADERS + CONTINUATION) before the connection is dropped."""
    max_partial: int = 64 << 20
    """Bytes of unfinished request messages one connection may hold, its streams together
    (received bytes are given back to the client's windows as they arrive, so a message larger
    than the windows can come in); the stream that brings more fails RESOURCE_EXHAUSTED."""
    preface_timeout_s: float = PREFACE_TIMEOUT_S
    """A connection that has not sent the HTTP/2 preface by then is closed."""
    send_timeout_s: float = 30.0
    """A response that cannot be written for this long (closed windows, or a client that
    does not read) resets its stream; the call is cancelled."""
    idle_timeout_s: float = 300.0
    """A connection with no stream open and none opened for this long (checked every
    ``idle_timeout_s``, so between one and two of them) is sent GOAWAY and closed."""


class StreamHandler(Protocol):
    """What a stream's request goes to (the gRPC call)."""

    def data_received(self, data: bytes, end_stream: bool) -> None: ...

    def reset(self) -> None:
        """The peer reset the stream, or the connection is gone: stop; send nothing."""


class StreamReset(Exception):
    """A send on a stream that is no longer open (reset, or the connection closed)."""


class ConnectionError_(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class StreamError(Exception):
    def __init__(self, stream_id: int, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.code = code


class Stream:
    """One request stream: the server's side of it."""

    __slots__ = (
        "_conn",
        "_waiter",
        "handler",
        "headers_sent",
        "held",
        "id",
        "is_local_closed",
        "is_mid_message",
        "is_remote_closed",
        "is_reset",
        "recv_window",
        "send_window",
        "unacked",
    )

    def __init__(self, conn: Http2Connection, stream_id: int, send_window: int) -> None:
        self._conn = conn
        self.id = stream_id
        self.send_window = send_window
        self.recv_window = conn.initial_stream_window
        self.unacked = 0
        """Consumed bytes not yet given back (sent in a WINDOW_UPDATE)."""
        self.held = 0
        """Bytes handed to the handler and not yet consumed."""
        self.is_remote_closed = False
        self.is_local_closed = False
        self.is_reset = False
        self.headers_sent = False
        self.is_mid_message = False
        self.handler: StreamHandler | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def is_open(self) -> bool:
        return not (self.is_reset or self.is_local_closed)

    def consumed(self, n: int) -> None:
        """The handler is done with ``n`` received bytes: give them back to the peer."""
        self._conn.give_back(self, n)

    def send_headers(self, block: bytes, *, end_stream: bool = False) -> None:
        """Headers (or, with ``end_stream``, trailers): not flow-controlled, sent at once."""
        if not self.is_open:
            raise StreamReset(f"stream {self.id} is closed")
        self.headers_sent = True
        self._conn.write_headers(self, block, end_stream)

    def send_now(
        self, data: bytes, *, headers: bytes | None = None, trailers: bytes | None = None
    ) -> bool:
        """``send_data`` when it needs no wait: DATA within the peer's windows in one frame,
        after ``headers`` and before ``trailers`` (which end the stream) when given, in one
        write. ``False`` (nothing sent) when it would have to wait or split."""
        conn = self._conn
        n = len(data)
        if (
            n > self.send_window
            or n > conn.send_window
            or n > conn.peer_max_frame
            or n >= 65_536
            or conn.is_paused
            or not self.is_open
        ):
            return False
        self.send_window -= n
        conn.send_window -= n
        out = frame_header(FrameType.DATA, 0, self.id, n) + data
        if headers is not None:
            self.headers_sent = True
            out = conn.headers_bytes(self.id, headers, False) + out
        if trailers is not None:
            out += conn.headers_bytes(self.id, trailers, True)
        conn.write(out)
        conn.responded += 1
        if trailers is not None:
            conn.closed_locally(self)
        return True

    async def send_data(
        self, data: bytes, *, headers: bytes | None = None, trailers: bytes | None = None
    ) -> None:
        """DATA within the peer's windows, after ``headers`` and before ``trailers`` (which end
        the stream) when given; one write when the windows allow. Waits for the windows and for
        the transport when needed; raises ``StreamReset`` when the stream goes meanwhile.
        ``is_mid_message`` is true while only part of ``data`` is out."""
        if self.send_now(data, headers=headers, trailers=trailers):
            return
        if not self.is_open:
            raise StreamReset(f"stream {self.id} is closed")
        conn = self._conn
        if headers is not None:
            self.headers_sent = True
            conn.write_headers(self, headers, False)
        view = memoryview(data)
        self.is_mid_message = True
        try:
            async with asyncio.timeout(conn.settings.send_timeout_s):
                while view:
                    await conn.wait_writable()
                    while (allowed := min(self.send_window, conn.send_window)) <= 0:
                        await self._wait_window()
                    if not self.is_open:
                        raise StreamReset(f"stream {self.id} is closed")
                    chunk = view[: min(allowed, conn.peer_max_frame)]
                    view = view[len(chunk) :]
                    self.send_window -= len(chunk)
                    conn.send_window -= len(chunk)
                    conn.write(frame_header(FrameType.DATA, 0, self.id, len(chunk)), bytes(chunk))
                    conn.responded += 1
        except TimeoutError:
            conn.send_timed_out(self)
            raise StreamReset(
                f"stream {self.id}: the client read nothing for {conn.settings.send_timeout_s:g} s"
            ) from None
        self.is_mid_message = False
        if trailers is not None:
            conn.write_headers(self, trailers, True)

    def reset(self, code: ErrorCode = ErrorCode.CANCEL) -> None:
        """End the stream from this side with RST_STREAM (no ``handler.reset()``)."""
        if self.is_open:
            self._conn.reset_stream(self, code, notify=False)

    async def _wait_window(self) -> None:
        if not self.is_open:
            raise StreamReset(f"stream {self.id} is closed")
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        self._conn.blocked.add(self)
        try:
            await waiter
        finally:
            self._waiter = None
            self._conn.blocked.discard(self)
        if not self.is_open:
            raise StreamReset(f"stream {self.id} is closed")

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def connection(self) -> Http2Connection:
        return self._conn

    @property
    def max_partial(self) -> int:
        return self._conn.settings.max_partial

    def hold_partial(self, n: int) -> bool:
        """``n`` more (or, negative, fewer) bytes of unfinished messages are buffered for this
        stream; False when the connection now holds more than ``max_partial``."""
        conn = self._conn
        conn.partial += n
        return conn.partial <= conn.settings.max_partial


OnRequest = Callable[[Stream, Headers], StreamHandler | None]
"""Builds the handler of a new stream; ``None`` when it answered (and closed) it already."""


class Http2Connection(asyncio.Protocol):
    """The server side of one HTTP/2 connection."""

    def __init__(
        self,
        on_request: OnRequest,
        settings: Http2Settings,
        on_closed: Callable[[Http2Connection], None] | None = None,
    ) -> None:
        self.settings = settings
        self._on_request = on_request
        self._on_closed = on_closed
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._has_preface = False
        self._decoder = hpack.Decoder(max_header_list_size=settings.max_header_list_size)
        self._continuation: tuple[int, int, bytearray] | None = None
        self.streams: dict[int, Stream] = {}
        self.blocked: set[Stream] = set()
        self._last_stream_id = 0
        self.send_window = DEFAULT_WINDOW
        self._peer_stream_window = DEFAULT_WINDOW
        self.peer_max_frame = MIN_FRAME_SIZE
        self._table_reset = True
        """The next header block starts with a table size update to 0."""
        self.initial_stream_window = max(settings.stream_window, DEFAULT_WINDOW)
        """A new stream's receive window: until the peer acknowledges our SETTINGS it may go
        by the default (RFC 9113 §6.5.3), and grpc clients send before they read them."""
        self._recv_window = max(settings.connection_window, DEFAULT_WINDOW)
        self._freed = min(0, settings.connection_window - DEFAULT_WINDOW)
        """Received bytes consumed (or dropped) and not yet given back to the peer. The
        connection window starts at the default and only WINDOW_UPDATE moves it, so a smaller
        one starts in debt: the first bytes consumed are not given back."""
        self.partial = 0
        """Bytes of unfinished request messages the streams' handlers hold."""
        self._budgets = Budgets(time.monotonic())
        self.responded = 0
        """Response frames (HEADERS, DATA) written so far: they earn flood budget."""
        self._credited = 0
        self._opened = 0
        """Streams opened so far (the idle check compares it)."""
        self._idle_timer: asyncio.TimerHandle | None = None
        self.is_paused = False
        self._is_reading_paused = False
        """Reading stopped by ``pause_writing``."""
        self._is_reading_frames = False
        self._drained: asyncio.Future[None] | None = None
        self._is_closing = False
        self._going_away = False
        self.idle: asyncio.Event = asyncio.Event()
        self.idle.set()

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = transport
        s = self.settings
        payload = settings_payload(
            [
                (Setting.MAX_CONCURRENT_STREAMS, s.max_concurrent_streams),
                (Setting.INITIAL_WINDOW_SIZE, s.stream_window),
                (Setting.MAX_FRAME_SIZE, s.max_frame_size),
                (Setting.MAX_HEADER_LIST_SIZE, s.max_header_list_size),
                (Setting.ENABLE_PUSH, 0),
            ]
        )
        out = frame(FrameType.SETTINGS, 0, 0, payload)
        if s.connection_window > DEFAULT_WINDOW:
            out += window_update(0, s.connection_window - DEFAULT_WINDOW)
        transport.write(out)
        loop = asyncio.get_running_loop()
        loop.call_later(s.preface_timeout_s, self._check_preface)
        self._idle_timer = loop.call_later(s.idle_timeout_s, self._check_idle, 0)

    def _check_preface(self) -> None:
        if not self._has_preface and not self._is_closing:
            self._close()

    def _check_idle(self, opened: int) -> None:
        """Close a connection that had no stream since the last check (GOAWAY first)."""
        self._idle_timer = None
        if self._is_closing:
            return
        if not self.streams and self._opened == opened:
            log.info("http2_idle_closed", idle_timeout_s=self.settings.idle_timeout_s)
            self.go_away()
            return
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_later(
            self.settings.idle_timeout_s, self._check_idle, self._opened
        )

    def _spend(self, kind: Flood) -> None:
        """One frame of a budgeted kind; past the budget, a connection error."""
        budgets = self._budgets
        if self.responded != self._credited:  # what the answers since earned (budgets.py)
            budgets.credit(self.responded - self._credited)
            self._credited = self.responded
        if not budgets.take(kind, time.monotonic()):
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, f"too many {kind.value} frames")

    def data_received(self, data: bytes) -> None:
        if self._is_closing:
            return
        self._buffer += data
        self._read_frames()

    def _read_frames(self) -> None:
        """Handle the complete frames buffered, until the transport asks to pause writing; then
        read no more until it resumes (``resume_writing``)."""
        if self._is_reading_frames:
            return  # a write in a frame's handler resumed at once: the loop below goes on
        self._is_reading_frames = True
        buffer = self._buffer
        try:
            if not self._has_preface:
                if len(buffer) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buffer)):
                        raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 preface")
                    return
                if buffer[: len(PREFACE)] != PREFACE:
                    raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 preface")
                del buffer[: len(PREFACE)]
                self._has_preface = True
            self._frames(buffer)
        except ConnectionError_ as exc:
            self.close_with(exc.code, str(exc))
        finally:
            self._is_reading_frames = False
            if self._is_reading_paused and not self.is_paused and not self._is_closing:
                self._is_reading_paused = False
                if self._transport is not None:
                    self._transport.resume_reading()

    def _frames(self, buffer: bytearray) -> None:
        pos, size, max_frame = 0, len(buffer), self.settings.max_frame_size
        try:
            while size - pos >= FRAME_HEADER_SIZE and not self.is_paused:
                length_kind, flags, stream_id = FRAME_HEADER.unpack_from(buffer, pos)
                length = length_kind >> 8
                if length > max_frame:
                    raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "frame too large")
                end = pos + FRAME_HEADER_SIZE + length
                if end > size:
                    break
                payload = bytes(buffer[pos + FRAME_HEADER_SIZE : end])
                pos = end
                try:
                    self._frame(length_kind & 0xFF, flags, stream_id & 0x7FFFFFFF, payload)
                except StreamError as exc:
                    stream = self.streams.get(exc.stream_id)
                    if stream is not None:
                        self.reset_stream(stream, exc.code, notify=True)
                    else:
                        self.write(rst_stream(exc.stream_id, exc.code))
                if self._is_closing:
                    return
        finally:
            del buffer[:pos]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is not None and kind != FrameType.CONTINUATION:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == FrameType.DATA:
            self._data(flags, stream_id, payload)
        elif kind == FrameType.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == FrameType.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == FrameType.PING:
            self._ping(flags, stream_id, payload)
        elif kind == FrameType.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == FrameType.RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == FrameType.CONTINUATION:
            self._continuation_frame(flags, stream_id, payload)
        elif kind == FrameType.GOAWAY:
            if stream_id != 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
            self._going_away = True
            self._close_if_done()
        elif kind == FrameType.PRIORITY:
            self._spend(Flood.PRIORITY)
            if stream_id == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise StreamError(stream_id, ErrorCode.FRAME_SIZE_ERROR, "bad PRIORITY")
        elif kind == FrameType.PUSH_PROMISE:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "a client cannot push")
        else:  # other frame types are ignored (RFC 9113 §4.1), within a budget
            self._spend(Flood.UNKNOWN)

    # --- frames --------------------------------------------------------------------------------

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        length = len(payload)
        if not flags & Flag.END_STREAM and (
            not length or (flags & Flag.PADDED and payload[0] == length - 1)
        ):
            self._spend(Flood.EMPTY_DATA)  # no data (padding only, at most): a flood's frame
        if length > self._recv_window:
            raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "connection window exceeded")
        self._recv_window -= length
        stream = self.streams.get(stream_id)
        if stream is None or stream.is_remote_closed:
            self._free(length)
            if stream_id > self._last_stream_id:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on an idle stream")
            if stream is not None:
                raise StreamError(stream_id, ErrorCode.STREAM_CLOSED, "DATA after END_STREAM")
            return  # a stream this side has closed or reset: frames in flight are dropped
        if length > stream.recv_window:
            self._free(length)
            raise StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "stream window exceeded")
        stream.recv_window -= length
        data = payload
        if flags & Flag.PADDED:
            if not payload or payload[0] >= length:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "bad padding")
            data = payload[1 : length - payload[0]]
        stream.held += len(data)
        if len(data) < length:
            self.give_back(stream, length - len(data), held=False)
        end_stream = bool(flags & Flag.END_STREAM)
        if end_stream:
            stream.is_remote_closed = True
        if stream.handler is not None:
            stream.handler.data_received(data, end_stream)
        if end_stream:
            self._forget_if_done(stream)

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        start, end = 0, len(payload)
        if flags & Flag.PADDED:
            if not payload or payload[0] >= len(payload):
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "bad padding")
            start, end = 1, len(payload) - payload[0]
        if flags & Flag.PRIORITY:
            start += 5
            if start > end:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "short HEADERS")
        block = payload[start:end]
        if flags & Flag.END_HEADERS:
            self._header_block(stream_id, flags & Flag.END_STREAM, block)
        else:
            if len(block) > self.settings.max_header_block:
                raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
            self._continuation = (stream_id, flags & Flag.END_STREAM, bytearray(block))

    def _continuation_frame(self, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._continuation
        if pending is None or pending[0] != stream_id:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "unexpected CONTINUATION")
        if not payload and not flags & Flag.END_HEADERS:
            self._spend(Flood.EMPTY_CONTINUATION)
        pending[2].extend(payload)
        if len(pending[2]) > self.settings.max_header_block:
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        if flags & Flag.END_HEADERS:
            self._continuation = None
            self._header_block(stream_id, pending[1], bytes(pending[2]))

    def _header_block(self, stream_id: int, end_stream: int, block: bytes) -> None:
        # A block may open with table size updates: two at most (each one costs the decoder).
        if leading_size_updates(block, MAX_TABLE_SIZE_UPDATES) > MAX_TABLE_SIZE_UPDATES:
            raise ConnectionError_(
                ErrorCode.COMPRESSION_ERROR, "more than two table size updates in a block"
            )
        try:
            headers: Headers = self._decoder.decode(block, raw=True)  # type: ignore[assignment]
        except hpack.HPACKError as exc:
            raise ConnectionError_(ErrorCode.COMPRESSION_ERROR, f"bad headers: {exc}") from None
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client
            if stream.is_remote_closed:
                raise StreamError(stream_id, ErrorCode.STREAM_CLOSED, "HEADERS after END_STREAM")
            if not end_stream:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "open-ended trailers")
            stream.is_remote_closed = True
            if stream.handler is not None:
                stream.handler.data_received(b"", True)
            self._forget_if_done(stream)
            return
        if stream_id <= self._last_stream_id:
            raise ConnectionError_(ErrorCode.STREAM_CLOSED, "HEADERS on a closed stream")
        if stream_id % 2 == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "even stream id from a client")
        self._last_stream_id = stream_id
        self._opened += 1
        if self._going_away or len(self.streams) >= self.settings.max_concurrent_streams:
            self.write(rst_stream(stream_id, ErrorCode.REFUSED_STREAM))
            return
        stream = Stream(self, stream_id, self._peer_stream_window)
        stream.is_remote_closed = bool(end_stream)
        self.streams[stream_id] = stream
        self.idle.clear()
        handler = self._on_request(stream, headers)
        if stream_id not in self.streams:
            return  # answered at once (e.g. an unknown method)
        stream.handler = handler
        if end_stream and handler is not None:
            handler.data_received(b"", True)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        self._spend(Flood.WINDOW_UPDATE)
        if len(payload) != 4:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "zero window increment")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "window over 2^31-1")
            self._wake_sendable()
            return
        stream = self.streams.get(stream_id)
        if increment == 0:
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "zero window increment")
        if stream is None:
            if stream_id > self._last_stream_id:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            raise StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "window over 2^31-1")
        if self.send_window > 0:
            stream.wake()

    def _ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._spend(Flood.PING)
        if stream_id != 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "bad PING")
        if not flags & Flag.ACK:
            self.write(frame(FrameType.PING, Flag.ACK, 0, payload))

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._spend(Flood.SETTINGS)
        if stream_id != 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & Flag.ACK:
            if payload:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            self._settings_acked()
            return
        if len(payload) % 6:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "bad SETTINGS")
        if len(payload) > 6 * MAX_SETTINGS_ENTRIES:
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "too many SETTINGS entries")
        settings: dict[int, int] = {}
        for key, value in parse_settings(payload):  # every value is checked; the last one wins
            if key == Setting.INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
                raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "window over 2^31-1")
            if key == Setting.MAX_FRAME_SIZE and not MIN_FRAME_SIZE <= value <= MAX_FRAME_SIZE:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
            if key == Setting.ENABLE_PUSH and value > 1:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "bad SETTINGS_ENABLE_PUSH")
            settings[key] = value
        if (window := settings.get(Setting.INITIAL_WINDOW_SIZE)) is not None:
            self._peer_stream_window_changed(window)
        if (max_frame := settings.get(Setting.MAX_FRAME_SIZE)) is not None:
            self.peer_max_frame = max_frame
        if Setting.HEADER_TABLE_SIZE in settings:
            self._table_reset = True
        self.write(frame(FrameType.SETTINGS, Flag.ACK, 0))

    def _peer_stream_window_changed(self, value: int) -> None:
        """SETTINGS_INITIAL_WINDOW_SIZE: every stream's send window moves by the change
        (RFC 9113 §6.9.2); the streams it opens are woken."""
        delta, self._peer_stream_window = value - self._peer_stream_window, value
        if not delta:
            return
        for stream in self.streams.values():
            stream.send_window += delta
            if stream.send_window > MAX_WINDOW:
                raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "window over 2^31-1")
        if delta > 0:
            self._wake_sendable()

    def _wake_sendable(self) -> None:
        """Wake the blocked streams that can send now: the connection window is open and so is
        their own (one whose window is shut stays asleep, however often the other moves)."""
        if self.send_window > 0:
            for blocked in [b for b in self.blocked if b.send_window > 0]:
                blocked.wake()

    def _settings_acked(self) -> None:
        """The peer goes by our SETTINGS from now on: a stream window smaller than the default
        shrinks the windows of the streams it opened before, as it does on its side."""
        delta = self.settings.stream_window - self.initial_stream_window
        if delta < 0:
            self.initial_stream_window = self.settings.stream_window
            for stream in self.streams.values():
                stream.recv_window += delta

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        self._spend(Flood.RESET)
        if stream_id == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "bad RST_STREAM")
        if stream_id > self._last_stream_id:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._drop(stream, notify=True)

    # --- flow control, receiving -------------------------------------------------------------

    def give_back(self, stream: Stream, n: int, *, held: bool = True) -> None:
        """``n`` bytes of ``stream`` are consumed: WINDOW_UPDATEs once half a window is due."""
        if self.streams.get(stream.id) is not stream:
            return  # forgotten: what it held was freed then
        if held:
            stream.held -= n
        out = b""
        if stream.is_open and not stream.is_remote_closed:
            stream.unacked += n
            if stream.unacked >= self.settings.stream_window // 2:
                out = window_update(stream.id, stream.unacked)
                stream.recv_window += stream.unacked
                stream.unacked = 0
        self._free(n, out)

    def _free(self, n: int, out: bytes = b"") -> None:
        """``n`` received bytes no longer held: the connection window grows back by halves."""
        self._freed += n
        if self._freed >= self.settings.connection_window // 2:
            out += window_update(0, self._freed)
            self._recv_window += self._freed
            self._freed = 0
        if out:
            self.write(out)

    # --- sending -------------------------------------------------------------------------------

    def write(self, data: bytes, more: bytes | None = None) -> None:
        transport = self._transport
        if transport is None or self._is_closing:
            return
        transport.write(data)
        if more is not None:
            transport.write(more)

    def headers_bytes(self, stream_id: int, block: bytes, end_stream: bool) -> bytes:
        if self._table_reset:
            self._table_reset = False
            block = TABLE_SIZE_ZERO + block
        return header_frames(stream_id, block, end_stream=end_stream, max_frame=self.peer_max_frame)

    def write_headers(self, stream: Stream, block: bytes, end_stream: bool) -> None:
        self.write(self.headers_bytes(stream.id, block, end_stream))
        self.responded += 1
        if end_stream:
            self.closed_locally(stream)

    def closed_locally(self, stream: Stream) -> None:
        """The response is complete (its END_STREAM is written)."""
        stream.is_local_closed = True
        if not stream.is_remote_closed:
            # The client need not send the rest of its request (RFC 9113 §8.1).
            self.write(rst_stream(stream.id, ErrorCode.NO_ERROR))
        self._forget(stream)

    def send_timed_out(self, stream: Stream) -> None:
        """A response could not be written within ``send_timeout_s``: reset its stream and
        cancel its call."""
        log.info(
            "http2_send_timeout", stream_id=stream.id, send_timeout_s=self.settings.send_timeout_s
        )
        if stream.is_open:
            self.reset_stream(stream, ErrorCode.CANCEL, notify=True)

    def reset_stream(self, stream: Stream, code: ErrorCode, *, notify: bool) -> None:
        self.write(rst_stream(stream.id, code))
        self._drop(stream, notify=notify)

    def _drop(self, stream: Stream, *, notify: bool) -> None:
        stream.is_reset = True
        self._forget(stream)
        stream.wake()
        if notify and stream.handler is not None:
            stream.handler.reset()

    def _forget_if_done(self, stream: Stream) -> None:
        if stream.is_local_closed:
            self._forget(stream)

    def _forget(self, stream: Stream) -> None:
        if self.streams.pop(stream.id, None) is None:
            return
        if stream.held:  # what the handler never consumed no longer holds the window
            self._free(stream.held)
            stream.held = 0
        if not self.streams:
            self.idle.set()
            self._close_if_done()

    async def wait_writable(self) -> None:
        while self.is_paused:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)
        if self._is_closing:
            raise StreamReset("the connection is closed")

    def pause_writing(self) -> None:
        self.is_paused = True
        if self._transport is not None and not self._is_closing and not self._is_reading_paused:
            self._is_reading_paused = True
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self.is_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None
        if self._is_reading_paused and not self._is_closing:
            self._read_frames()  # what arrived before the pause; then reads on (or pauses again)

    # --- closing --------------------------------------------------------------------------------

    def go_away(self) -> None:
        """Graceful: take no new streams; close once the open ones are done."""
        if not self._going_away and not self._is_closing:
            self._going_away = True
            self.write(goaway(self._last_stream_id, ErrorCode.NO_ERROR))
        self._close_if_done()

    def close_with(self, code: ErrorCode, message: str) -> None:
        """A connection error (or the server's hard stop): GOAWAY, then close."""
        if self._is_closing:
            return
        if code != ErrorCode.NO_ERROR:
            log.info("http2_connection_error", code=code.name, error=message)
        self.write(goaway(self._last_stream_id, code, message.encode()[:256]))
        self._close(linger=code != ErrorCode.NO_ERROR)

    def _close_if_done(self) -> None:
        if self._going_away and not self.streams:
            self._close()

    def _close(self, *, linger: bool = False) -> None:
        """Close the connection. ``linger``: after a connection error, shut only this side
        and drop what the client still sends for ``LINGER_S`` before closing: a socket closed
        with unread bytes is reset, and a reset can destroy the GOAWAY before the client reads
        it."""
        if self._is_closing:
            return
        self._is_closing = True
        self._stop_idle_timer()
        self._buffer.clear()
        transport = self._transport
        if transport is not None:
            if linger and transport.can_write_eof():
                transport.write_eof()
                if self._is_reading_paused:
                    self._is_reading_paused = False
                    transport.resume_reading()
                asyncio.get_running_loop().call_later(LINGER_S, transport.close)
            else:
                transport.close()
        self._abort_streams()

    def _stop_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._is_closing = True
        self._stop_idle_timer()
        self._abort_streams()
        self.resume_writing()
        if self._on_closed is not None:
            self._on_closed(self)

    def _abort_streams(self) -> None:
        for stream in list(self.streams.values()):
            self._drop(stream, notify=True)
        self.idle.set()
