"""Bounds on an HTTP client that stalls an admitted request, so that it cannot hold its
admission slot: its body must arrive within ``--body-timeout-s`` (``BodyDeadline``), and each
write of the response go out within ``--send-timeout-s`` (``BoundedSend``). Past either, the
connection is aborted, which the server and ``Relay`` see as a client disconnect: the request is
cancelled on the bus and its slot freed.

Both reach uvicorn's request cycle through ``send``, a bound method of it (httptools and h11
alike): its ``flow`` says whether a write will wait, its ``transport`` is what is aborted.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import structlog
from litestar.types import Message, Receive, ReceiveMessage, Send

log = structlog.get_logger(__name__)

SEND_TIMEOUT = "send_timeout"
"""The error code of a request ended by ``--send-timeout-s`` (access line, errors metric)."""
BODY_TIMEOUT = "body_timeout"
"""The error code of a request ended by ``--body-timeout-s``."""


def abort_connection(cycle: object, unenforced: str, timeout_s: float) -> None:
    """Abort the connection of uvicorn's request ``cycle`` (closed at once, unsent bytes
    dropped: ``close()`` would wait for them); only log ``unenforced`` under a server whose
    cycle has no transport."""
    abort = getattr(getattr(cycle, "transport", None), "abort", None)
    if callable(abort):
        abort()
    else:
        log.warning(unenforced, timeout_s=timeout_s)


class BodyDeadline:
    """An admitted request's ASGI ``receive``: the whole body within ``timeout_s`` of
    admission (a client that sends its headers and then trickles or withholds the body would
    hold its slot otherwise). One timer per request, cancelled by the body's last part; past
    it, the connection is aborted and ``receive()`` answers ``http.disconnect``."""

    __slots__ = ("_cycle", "_receive", "_timeout_s", "_timer", "timed_out")

    def __init__(self, receive: Receive, send: Send, timeout_s: float) -> None:
        self._receive = receive
        self._timeout_s = timeout_s
        self._cycle = getattr(send, "__self__", None)
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            timeout_s, self._expire
        )
        self.timed_out = False
        """Whether the body was still incomplete after ``timeout_s`` (the connection aborted)."""

    async def __call__(self) -> ReceiveMessage:
        message = await self._receive()
        if self._timer is not None and (
            message["type"] != "http.request" or not message.get("more_body", False)
        ):
            self.cancel()
        return message

    def cancel(self) -> None:
        """The body is in (or the request is over): no deadline any more."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self.timed_out = True
        abort_connection(self._cycle, "body_timeout_unenforced", self._timeout_s)


class BoundedSend:
    """An admitted request's ASGI ``send``, each call bounded by ``timeout_s``.

    uvicorn's ``send`` waits only while its connection's writing is paused (the client is not
    reading and the buffers are full). A send that does not wait, the usual case, costs no
    timer; one that waits arms one ``call_later``. Past ``timeout_s`` the connection is aborted
    (closed at once, its unsent bytes dropped: ``close()`` would wait for them). The server then
    sees the client gone, as on a disconnect: the waiting send returns, later ones are no-ops,
    ``receive()`` answers ``http.disconnect`` (so ``Relay`` cancels the request), and the app
    may return with its response unfinished without uvicorn logging an error.

    ``send`` is a bound method of uvicorn's request cycle (httptools and h11 alike): its
    ``flow.write_paused`` says whether a send will wait (about 0.1 µs to ask, where stepping into
    the send to see costs 0.4), its ``transport`` is what is aborted. Under another server, or
    a middleware that wraps ``send``, each send is stepped into instead, and a send past
    ``timeout_s`` is only logged (``send_timeout_unenforced``): there is nothing to abort.
    """

    __slots__ = ("_cycle", "_flow", "_send", "_timeout_s", "timed_out")

    def __init__(self, send: Send, timeout_s: float) -> None:
        self._send = send
        self._timeout_s = timeout_s
        self._cycle = getattr(send, "__self__", None)
        self._flow = getattr(self._cycle, "flow", None)
        self.timed_out = False
        """Whether a send waited ``timeout_s`` (then the connection was aborted)."""

    def __call__(self, message: Message) -> Awaitable[None]:
        flow = self._flow
        if flow is not None and not flow.write_paused:
            return self._send(message)  # will not wait
        return _sent_within(self._send(message), self._timeout_s, self._expire)

    def _expire(self) -> None:
        if self.timed_out:
            return
        self.timed_out = True
        abort_connection(self._cycle, "send_timeout_unenforced", self._timeout_s)


@types.coroutine
def _sent_within(
    sending: Awaitable[None], timeout_s: float, on_timeout: Callable[[], None]
) -> Generator[Any, Any, None]:
    """Await ``sending``; when it is still waiting after ``timeout_s``, call ``on_timeout``.

    The first step runs at once: a send that completes without suspending returns before any
    timer exists. Otherwise this drives the send as ``await`` would, with one timer around it
    (a generator, not ``asyncio.wait_for``: no task, no extra future).
    """
    steps = sending.__await__()
    try:
        waiting = steps.send(None)
    except StopIteration:
        return
    timer = asyncio.get_running_loop().call_later(timeout_s, on_timeout)
    try:
        while True:
            try:
                resumed = yield waiting
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed on: cancellation reaches the send
                waiting = steps.throw(exc)
            else:
                waiting = steps.send(resumed)
    except StopIteration:
        return
    finally:
        timer.cancel()
