"""One gRPC call on an HTTP/2 stream, behind ``grpc.aio``'s servicer interface.

``Call`` is both the stream's handler (length-prefixed messages in, RST_STREAM) and the
``context`` a servicer method gets: ``abort``, ``time_remaining``, ``invocation_metadata``,
``set_trailing_metadata``, ``set_code``/``set_details`` and ``write``. So
servicers written for ``grpc.aio`` — ours, and grpcio's health and reflection servicers — run
unchanged, from the handlers that generated ``add_*Servicer_to_server`` functions register.

Status semantics follow grpc: ``abort`` ends the call with its code; an exception out of the
method is UNKNOWN (or the code set before it); the deadline (``grpc-timeout``) cancels the
method and answers DEADLINE_EXCEEDED, even one that expires before the method starts (``1n``);
a client RST_STREAM or a lost connection cancels it and
sends nothing. Received bytes are given back to the client's window as soon as they are read,
unless messages are queued unread (a streaming method that is behind, or one that paused
``each_request``): then once it catches up, so a client can never have more than its window
of messages waiting here. A message that is still arriving is buffered whole (a message may
be larger than the windows), within the connection's ``max_partial`` bytes for all its streams.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
import structlog

from services.gateway.grpc.http2.connection import Stream, StreamReset
from services.gateway.grpc.http2.frames import (
    MESSAGE_PREFIX,
    RESPONSE_HEADERS,
    TRAILERS_OK,
    ErrorCode,
    decode_metadatum,
    trailers,
)

log = structlog.get_logger(__name__)

Metadata = Sequence[tuple[str, str | bytes]]
Handler = Any
"""``grpc.RpcMethodHandler`` (grpcio's namedtuple; its stubs do not type it)."""


@dataclass(frozen=True, slots=True)
class CallLimits:
    max_receive: int
    max_send: int


class Abort(Exception):
    """``context.abort(...)``: end the call with this status."""

    def __init__(self, code: grpc.StatusCode, details: str, metadata: Metadata = ()) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.metadata = metadata


_WBITS = {"gzip": 31, "deflate": 15}
"""zlib's window bits for each ``grpc-encoding``: gzip (RFC 1952) and zlib (RFC 1950) framing."""
SUPPORTED_ENCODINGS = frozenset({"identity", *_WBITS})


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    """``data`` decompressed, but never more than ``limit + 1`` bytes of it: the message limit
    holds for what a message inflates to, not for its compressed size."""
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(data, limit + 1)
    if len(out) <= limit and not inflater.eof:
        raise zlib.error("incomplete or truncated stream")
    return out


class Call:
    """One call: reads its messages, runs the method in a task, writes its responses."""

    __slots__ = (
        "_buffer",
        "_code",
        "_deadline",
        "_deferred",
        "_details",
        "_each",
        "_ended",
        "_expired",
        "_finished",
        "_handler",
        "_is_held",
        "_limits",
        "_metadata",
        "_partial",
        "_queue",
        "_raw_metadata",
        "_sending",
        "_started",
        "_stream",
        "_timer",
        "_trailing",
        "_waiter",
        "_wbits",
        "method",
        "task",
    )

    def __init__(
        self,
        stream: Stream,
        method: str,
        handler: Handler,
        raw_metadata: list[tuple[bytes, bytes]],
        timeout_s: float | None,
        encoding: str,
        limits: CallLimits,
    ) -> None:
        self._stream = stream
        self.method = method
        self._handler = handler
        self._raw_metadata = raw_metadata
        self._metadata: tuple[tuple[str, str | bytes], ...] | None = None
        self._limits = limits
        self._wbits = _WBITS.get(encoding)
        self._buffer = bytearray()
        self._partial = 0
        """``len(_buffer)`` as last told to the connection (``Stream.hold_partial``)."""
        self._queue: deque[bytes] = deque()
        self._deferred = 0
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None
        self._sending: asyncio.Future[None] | None = None
        self._each: Callable[[Any], None] | None = None
        self._is_held = False
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailing: Metadata = ()
        self._finished = False
        self._expired = False
        self._started = False
        loop = asyncio.get_running_loop()
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        if timeout_s is not None:
            self._deadline = time.monotonic() + timeout_s
            self._timer = loop.call_later(timeout_s, self._expire)
        self.task: asyncio.Task[None] = loop.create_task(self._run())

    # --- the stream's side ---------------------------------------------------------------------

    def data_received(self, data: bytes, end_stream: bool) -> None:
        if data:
            if self._queue or self._is_held:  # behind: hold the window until it catches up
                self._deferred += len(data)
            else:
                self._stream.consumed(len(data))
            self._split(data)
            if len(self._buffer) != self._partial:
                self._held_partial()
            if self._each is not None:
                self._hand_out()
        if end_stream:
            self._ended = True
            if self._buffer and not self._finished:
                self._fail_now(grpc.StatusCode.INTERNAL, "The request ended inside a message.")
        self._wake()

    def _split(self, data: bytes) -> None:
        """Complete length-prefixed messages to the queue; a partial one stays buffered."""
        buffer = self._buffer
        if not buffer and len(data) >= 5:
            flag, length = MESSAGE_PREFIX.unpack_from(data)
            if len(data) == 5 + length and length <= self._limits.max_receive:
                self._queue.append(self._payload(flag, data[5:]))
                return
        buffer += data
        while len(buffer) >= 5 and not self._finished:
            flag, length = MESSAGE_PREFIX.unpack_from(buffer)
            if length > self._limits.max_receive:
                self._fail_now(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({length} vs. {self._limits.max_receive})",
                )
                return
            if len(buffer) < 5 + length:
                return
            self._queue.append(self._payload(flag, bytes(buffer[5 : 5 + length])))
            del buffer[: 5 + length]

    def _held_partial(self) -> None:
        """Tell the connection how much of an unfinished message this call now buffers; fail
        the call when the connection holds more than it may."""
        size = 0 if self._finished else len(self._buffer)
        delta, self._partial = size - self._partial, size
        if not self._stream.hold_partial(delta) and delta > 0:
            self._fail_now(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "This connection's unfinished request messages exceed "
                f"{self._stream.max_partial} bytes; send fewer large messages at once.",
            )

    def _payload(self, flag: int, data: bytes) -> bytes:
        if not flag:
            return data
        if self._wbits is None:
            self._fail_now(grpc.StatusCode.INTERNAL, "A compressed message without grpc-encoding.")
            return b""
        limit = self._limits.max_receive
        try:
            data = _inflate(data, self._wbits, limit)
        except zlib.error:
            self._fail_now(grpc.StatusCode.INTERNAL, "A message failed to decompress.")
            return b""
        if len(data) > limit:
            self._fail_now(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max (over {limit} bytes decompressed)",
            )
            return b""
        return data

    def reset(self) -> None:
        """The client cancelled (RST_STREAM) or went away: stop the method, send nothing."""
        self._finished = True
        self._cancel_timer()
        if self._partial:
            self._held_partial()
        self.task.cancel()

    def _expire(self) -> None:
        self._timer = None
        if not self._finished:
            self._expired = True
            if self._started:
                self.task.cancel()
            # else: the task was not run yet (a deadline under a loop turn); it answers at once

    def _fail_now(self, code: grpc.StatusCode, details: str) -> None:
        self._finish(code, details, ())
        self.task.cancel()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- reading ------------------------------------------------------------------------------

    async def _next(self) -> bytes | None:
        """The next request message; ``None`` once the client has half-closed."""
        queue = self._queue
        while not queue:
            if self._ended:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = queue.popleft()
        if not queue and self._deferred:
            self._stream.consumed(self._deferred)
            self._deferred = 0
        return data

    def _parse(self, data: bytes) -> Any:
        try:
            return self._handler.request_deserializer(data)
        except Exception:  # noqa: BLE001 - any parse failure is the client's message
            raise Abort(grpc.StatusCode.INTERNAL, "Failed to parse the request message.") from None

    def _hand_out(self) -> None:
        """``each_request``: every queued message to the callback, now (unless paused)."""
        each, queue = self._each, self._queue
        assert each is not None
        while queue and not self._finished and not self._is_held:
            data = queue.popleft()
            try:
                request = self._parse(data)
            except Abort as exc:
                self._fail_now(exc.code, exc.details)
                return
            each(request)
        if self._deferred and not queue and not self._is_held:
            self._stream.consumed(self._deferred)
            self._deferred = 0

    async def each_request(self, start: Callable[[Any], None]) -> None:
        """Hand each request message to ``start`` as soon as it is read (no task hop, unlike
        iterating the requests); return once the client has half-closed. Not in
        ``grpc.aio``: for a streaming method that answers requests concurrently (and bounds
        how many at once with ``pause_requests``)."""
        self._each = start
        self._hand_out()
        while not self._ended or self._queue:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def pause_requests(self) -> None:
        """``each_request``: hand out no more messages, and give the client no more window
        (so it stops sending), until ``resume_requests``. Not in ``grpc.aio``."""
        self._is_held = True

    def resume_requests(self) -> None:
        """``each_request``: hand out what was held back, give the window back, read on."""
        if not self._is_held:
            return
        self._is_held = False
        if self._each is not None:
            self._hand_out()
        self._wake()

    async def _requests(self) -> AsyncIterator[Any]:
        while (data := await self._next()) is not None:
            yield self._parse(data)

    async def _one_request(self) -> Any:
        data = await self._next()
        if data is None or await self._next() is not None:
            raise Abort(grpc.StatusCode.INTERNAL, "A unary call needs exactly one request message.")
        return self._parse(data)

    # --- running ------------------------------------------------------------------------------

    async def _run(self) -> None:
        self._started = True
        if self._expired:
            self._finish(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ())
            return
        handler = self._handler
        try:
            request = self._requests() if handler.request_streaming else await self._one_request()
            if not handler.response_streaming:
                fn = handler.stream_unary if handler.request_streaming else handler.unary_unary
                response = await fn(request, self)
                if response is None and self._code not in (None, grpc.StatusCode.OK):
                    raise Abort(self._code, self._details, self._trailing)
                await self._respond(response)
                return
            fn = handler.stream_stream if handler.request_streaming else handler.unary_stream
            result = fn(request, self)
            if hasattr(result, "__anext__"):
                async for response in result:
                    await self.write(response)
            else:
                await result
            self._finish(self._code or grpc.StatusCode.OK, self._details, self._trailing)
        except Abort as exc:
            self._finish(exc.code, exc.details, exc.metadata or self._trailing)
        except StreamReset:
            self._finished = True
            if self._partial:
                self._held_partial()
        except asyncio.CancelledError:
            if self._expired:
                self._finish(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ())
            else:
                self._finish(grpc.StatusCode.CANCELLED, "Cancelled", ())
        except Exception as exc:
            if self._code in (None, grpc.StatusCode.OK):
                log.exception("grpc_method_crashed", method=self.method)
            self._finish(
                self._code or grpc.StatusCode.UNKNOWN,
                self._details or f"Unexpected {type(exc)}: {exc}",
                self._trailing,
            )

    async def _respond(self, response: Any) -> None:
        """A unary response: headers, the message and the trailers, in one write if it fits."""
        data = self._serialize(response)
        if self._finished:
            return
        self._finished = True
        self._cancel_timer()
        stream = self._stream
        ending = TRAILERS_OK if not self._trailing else trailers(0, "", self._trailing)
        await stream.send_data(
            data, headers=None if stream.headers_sent else RESPONSE_HEADERS, trailers=ending
        )

    def _serialize(self, response: Any) -> bytes:
        try:
            data: bytes = self._handler.response_serializer(response)
        except Exception:
            log.exception("grpc_response_unserializable", method=self.method)
            raise Abort(grpc.StatusCode.INTERNAL, "Failed to serialize the response.") from None
        if len(data) > self._limits.max_send:
            raise Abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(data)} vs. {self._limits.max_send})",
            )
        return MESSAGE_PREFIX.pack(0, len(data)) + data

    def _finish(self, code: grpc.StatusCode, details: str, metadata: Metadata) -> None:
        if self._finished:
            return
        self._finished = True
        self._cancel_timer()
        if self._partial:
            self._held_partial()
        stream = self._stream
        if stream.is_mid_message:  # trailers now would end inside a message
            stream.reset(ErrorCode.CANCEL)
        elif stream.is_open:
            only = not stream.headers_sent
            block = trailers(code.value[0], details, metadata, trailers_only=only)
            stream.send_headers(block, end_stream=True)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # --- the servicer's context (grpc.aio.ServicerContext) -------------------------------------

    async def write(self, message: Any) -> None:
        """One response of a streaming method. Unlike ``grpc.aio``, tasks of the method may
        write concurrently: messages go out whole, one after another."""
        await self.write_framed(self._serialize(message))

    async def write_framed(self, data: bytes) -> None:
        """Responses already serialized with their 5-byte gRPC prefixes (one or more), e.g.
        as the formatter builds them; whole, as ``write``."""
        while self._sending is not None:  # another message is waiting for window
            await asyncio.shield(self._sending)
        if self._finished:
            raise StreamReset("the call is over")
        stream = self._stream
        headers = None if stream.headers_sent else RESPONSE_HEADERS
        if stream.send_now(data, headers=headers):
            return
        sending = self._sending = asyncio.get_running_loop().create_future()
        try:
            await stream.send_data(data, headers=headers)
        finally:
            self._sending = None
            sending.set_result(None)

    @property
    def connection(self) -> object:
        """The client connection the call came on (an admission owner); not in ``grpc.aio``."""
        return self._stream.connection

    def add_done_callback(self, callback: Callable[[Call], None]) -> None:
        """``callback(self)`` once the call is over: answered (its last byte written), aborted,
        or cancelled (as ``grpc.aio``'s)."""
        self.task.add_done_callback(lambda _: callback(self))

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Metadata = ()
    ) -> NoReturn:
        raise Abort(code, details, trailing_metadata)

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        if self._metadata is None:
            self._metadata = tuple(decode_metadatum(k, v) for k, v in self._raw_metadata)
        return self._metadata

    def set_trailing_metadata(self, trailing_metadata: Metadata) -> None:
        self._trailing = tuple(trailing_metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details
