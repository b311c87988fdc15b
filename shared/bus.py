"""NATS connection helpers: connect with reconnect, detect "no responders", run until a signal."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import nats
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT_S = 5.0


async def connect(url: str, *, name: str, **kwargs: Any) -> Client:
    """Connect to NATS with endless reconnects; log state changes instead of raising."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats_error", error=str(exc))

    async def on_disconnected() -> None:
        log.warning("nats_disconnected")

    async def on_reconnected() -> None:
        log.info("nats_reconnected")

    servers = [s.strip() for s in url.split(",") if s.strip()]
    return await nats.connect(
        servers,
        name=name,
        connect_timeout=CONNECT_TIMEOUT_S,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        allow_reconnect=True,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
        pending_size=64 * 1024 * 1024,
        flusher_queue_size=4096,
        **kwargs,
    )


def no_responders(msg: Msg) -> str | None:
    """If ``msg`` is the server's "no responders" status, the subject nobody listened on."""
    headers = msg.headers
    if headers and headers.get("Status") == "503" and not msg.data:
        return headers.get("Nats-Subject", "?")
    return None


async def barrier(nc: Client) -> None:
    """Return once the server has every subscription made so far.

    nats-py 2.16's ``flush()`` writes its PING straight to the socket, possibly ahead of SUBs
    still in the client's buffer, so one flush can return before the server knows them; the
    second PING is queued behind them.
    """
    await nc.flush()
    await nc.flush()


async def wait_for_signal(stop: asyncio.Event | None = None) -> None:
    """Block until SIGINT/SIGTERM (or ``stop`` is set)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a service's async main on uvloop when available (faster per message)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        asyncio.run(main())
        return
    uvloop.run(main())
