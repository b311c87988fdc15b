"""A gRPC server on the running event loop: HTTP/2 connections (``connection.py``) whose
streams become calls (``calls.py``) of the methods registered the ``grpc.aio`` way.

``add_registered_method_handlers`` and ``add_generic_rpc_handlers`` are what the generated
``add_*Servicer_to_server`` functions call, so those register servicers here unchanged.
``start`` binds (an ``OSError`` when the address is taken); ``stop(grace)`` sends GOAWAY,
lets open calls finish for up to ``grace`` seconds, then cancels the rest and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import grpc
import structlog

from services.gateway.grpc.http2.calls import SUPPORTED_ENCODINGS, Call, CallLimits, Handler
from services.gateway.grpc.http2.connection import (
    Headers,
    Http2Connection,
    Http2Settings,
    Stream,
)
from services.gateway.grpc.http2.frames import ErrorCode, http_status, parse_timeout, trailers

log = structlog.get_logger(__name__)

_SKIPPED_HEADERS = frozenset({b"content-type", b"te", b"grpc-accept-encoding"})


class _CallDetails(NamedTuple):
    """``grpc.HandlerCallDetails`` for generic handlers."""

    method: str
    invocation_metadata: tuple[tuple[str, str | bytes], ...]


class Server:
    """gRPC over HTTP/2 (cleartext, prior knowledge), served on the current event loop."""

    def __init__(
        self,
        http2: Http2Settings,
        limits: CallLimits,
        *,
        authorize: Callable[[str, list[tuple[bytes, bytes]]], bool] | None = None,
    ) -> None:
        """``authorize(method, metadata)``: False refuses the call UNAUTHENTICATED before its
        method runs (API keys)."""
        self._http2 = http2
        self._limits = limits
        self._authorize = authorize
        self._methods: dict[str, Handler] = {}
        self._generic: list[Any] = []
        self._server: asyncio.Server | None = None
        self._connections: set[Http2Connection] = set()
        self._calls: set[Call] = set()

    # --- registration, as grpc.aio.Server -------------------------------------------------------

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Handler]) -> None:
        for name, handler in handlers.items():
            self._methods[f"/{service}/{name}"] = handler

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        self._generic.extend(handlers)

    def _lookup(self, method: str) -> Handler | None:
        handler = self._methods.get(method)
        if handler is None:
            for generic in self._generic:
                handler = generic.service(_CallDetails(method, ()))
                if handler is not None:
                    break
        return handler

    # --- serving --------------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); the bound port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, host, port, reuse_port=False)
        return int(self._server.sockets[0].getsockname()[1])

    def _connection(self) -> Http2Connection:
        conn = Http2Connection(self._request, self._http2, self._connections.discard)
        self._connections.add(conn)
        return conn

    def _request(self, stream: Stream, headers: Headers) -> Call | None:
        """A new stream's call, or ``None`` when the request was answered at once."""
        path = method = content_type = b""
        timeout = encoding = None
        metadata: list[tuple[bytes, bytes]] = []
        for name, value in headers:
            if name[:1] == b":":
                if name == b":path":
                    path = value
                elif name == b":method":
                    method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value
            elif name not in _SKIPPED_HEADERS:
                metadata.append((name, value))
        if method != b"POST":
            stream.send_headers(http_status(405), end_stream=True)
            return None
        if not _is_grpc(content_type):
            stream.send_headers(http_status(415), end_stream=True)
            return None
        rpc = path.decode("latin-1")
        handler = self._lookup(rpc)
        if handler is None:
            _refuse(stream, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return None
        if self._authorize is not None and not self._authorize(rpc, metadata):
            _refuse(
                stream,
                grpc.StatusCode.UNAUTHENTICATED,
                "Missing or invalid API key: send metadata 'authorization: Bearer <key>'.",
            )
            return None
        coding = "identity" if encoding is None else encoding.decode("latin-1")
        if coding not in SUPPORTED_ENCODINGS:
            _refuse(stream, grpc.StatusCode.UNIMPLEMENTED, f"Compression `{coding}` unsupported.")
            return None
        timeout_s = None
        if timeout is not None:
            try:
                timeout_s = parse_timeout(timeout)
            except ValueError:
                _refuse(stream, grpc.StatusCode.INTERNAL, "Malformed grpc-timeout.")
                return None
        call = Call(stream, rpc, handler, metadata, timeout_s, coding, self._limits)
        self._calls.add(call)
        call.task.add_done_callback(lambda _: self._calls.discard(call))
        return call

    async def stop(self, grace_s: float) -> None:
        """GOAWAY to every connection; after ``grace_s`` cancel what is still running."""
        if self._server is None:
            return
        self._server.close()
        connections = list(self._connections)
        for conn in connections:
            conn.go_away()
        waits = [asyncio.ensure_future(conn.idle.wait()) for conn in connections]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=grace_s)
            for wait in pending:
                wait.cancel()
        for conn in list(self._connections):
            conn.close_with(ErrorCode.NO_ERROR, "the server is stopping")
        if self._calls:  # cancelled calls tell the bus (Cancel) before it closes
            await asyncio.wait([call.task for call in self._calls], timeout=1.0)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        self._server = None


def _is_grpc(content_type: bytes) -> bool:
    """``application/grpc``, bare or with a ``+format`` or parameters; not ``application/grpc-web``
    (another protocol: its trailers travel in the body)."""
    subtype = content_type[len(b"application/grpc") :]
    return content_type.startswith(b"application/grpc") and subtype[:1] in (b"", b"+", b";")


def _refuse(stream: Stream, code: grpc.StatusCode, message: str) -> None:
    stream.send_headers(trailers(code.value[0], message, trailers_only=True), end_stream=True)
