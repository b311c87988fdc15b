"""NATS connection helpers: connect with reconnect, detect "no responders", run until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import nats
import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT_S = 2.0
"""Per attempt. A hung cluster node still accepts TCP (its kernel answers) but never says hello;
it is in the server pool twice (seed name and advertised address), so reconnecting can cost two
attempts on it before a live node is tried."""
RECONNECT_WAIT_S = 0.5
"""Wait before trying the same server again; with several seed URLs the next one is tried at
once, so a lost cluster node costs about one connect round trip."""
PING_INTERVAL_S = 5
MAX_OUTSTANDING_PINGS = 2
"""A server gone silent without closing the socket (a host lost, a partition, a hung process)
is given up at the third unanswered ping, 10 to 15 s after it went silent, instead of nats-py's
default 4 to 6 minutes (every 120 s, 2 outstanding): requests through it stall until then."""


Hook = Callable[[], Awaitable[None]]


async def connect(
    url: str,
    *,
    name: str,
    on_lost: Hook | None = None,
    on_back: Hook | None = None,
    **kwargs: Any,
) -> Client:
    """Connect to NATS with endless reconnects; log state changes instead of raising.

    ``url`` may list several servers, comma-separated (a cluster's seed URLs): nats-py picks
    them in random order, so services spread over the nodes, and reconnects to another one when
    its node goes; publishes made meanwhile wait in the pending buffer. ``on_lost`` is awaited
    when the connection drops, ``on_back`` when it is up again (subscriptions already replayed).
    """

    async def on_error(exc: Exception) -> None:
        log.warning("nats_error", error=str(exc))

    async def on_disconnected() -> None:
        log.warning("nats_disconnected")
        if on_lost is not None:
            await on_lost()

    async def on_reconnected() -> None:
        # ``nc`` is bound by then: callbacks run only after the first connect returned.
        log.info("nats_reconnected", server=nc.connected_url and nc.connected_url.netloc)
        if on_back is not None:
            await on_back()

    servers = [s.strip() for s in url.split(",") if s.strip()]
    nc = await nats.connect(
        servers,
        name=name,
        connect_timeout=CONNECT_TIMEOUT_S,
        max_reconnect_attempts=-1,
        reconnect_time_wait=RECONNECT_WAIT_S,
        ping_interval=PING_INTERVAL_S,
        max_outstanding_pings=MAX_OUTSTANDING_PINGS,
        allow_reconnect=True,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
        pending_size=64 * 1024 * 1024,
        flusher_queue_size=4096,
        **kwargs,
    )
    return nc


async def consumer_alive(sub: JetStreamContext.PushSubscription, timeout_s: float) -> bool | None:
    """Whether the server still has ``sub``'s consumer: ``False`` when it says it has none (a
    restarted server forgets ephemeral consumers, and nats-py notices only after two missed
    idle heartbeats, 10 s), ``None`` when it cannot be asked now (disconnected, no answer)."""
    try:
        await asyncio.wait_for(sub.consumer_info(), timeout_s)
    except NotFoundError:  # no such consumer, or no such stream
        return False
    except (nats.errors.Error, TimeoutError):
        return None
    return True


SUB_DRAIN_TIMEOUT_S = 5.0


async def drain_subscription(sub: Subscription, timeout_s: float = SUB_DRAIN_TIMEOUT_S) -> None:
    """Stop a subscription, first handling what was already delivered to it, within
    ``timeout_s``: nats-py's ``drain`` waits for its queue with no bound of its own."""
    try:
        await asyncio.wait_for(sub.drain(), timeout_s)  # type: ignore[no-untyped-call]
    except (nats.errors.Error, TimeoutError) as exc:
        log.warning("subscription_drain_cut", subject=sub.subject, error=repr(exc))
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


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


@contextlib.contextmanager
def stopped_by_signals(stop: asyncio.Event) -> Iterator[asyncio.Event]:
    """Within: SIGINT/SIGTERM set ``stop`` instead of killing the process. Entered before a
    service starts, so a signal during start-up becomes a graceful stop once it has started."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
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
