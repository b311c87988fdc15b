"""The direct-write client (``shared.nats_client``) on a real nats-server: every publish
arrives, in order, whichever path it took (straight to the socket, or nats-py's pending list
and flusher for messages with headers and while something is pending)."""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.router.config import RouterConfig
from services.router.service import Router
from shared.bus import connect
from shared.lifecycle import serving
from shared.nats_client import Client as DirectClient
from shared.subjects import Subjects

TIMEOUT_S = 5.0


async def test_publishes_arrive_in_order_across_both_paths(
    nats_url: str, nc: Client, subjects: Subjects
) -> None:
    subject = f"{subjects.namespace}.order"
    got: list[bytes] = []
    done = asyncio.Event()
    total = 600

    async def on_msg(msg: Msg) -> None:
        got.append(msg.data)
        if len(got) == total:
            done.set()

    await nc.subscribe(subject, cb=on_msg)
    await nc.flush()
    sender = await connect(nats_url, name="order-test")
    try:
        assert isinstance(sender, DirectClient)
        for i in range(total):
            headers = {"n": str(i)} if i % 7 == 0 else None  # headers: the flusher's path
            await sender.publish(subject, b"%d" % i, headers=headers)
            if i % 50 == 0:
                await asyncio.sleep(0)  # let the flusher run now and then
        await asyncio.wait_for(done.wait(), TIMEOUT_S)
    finally:
        await sender.drain()
    assert got == [b"%d" % i for i in range(total)]


def test_a_client_not_connected_never_writes_directly() -> None:
    assert DirectClient()._direct_writer() is None


async def test_a_router_s_connection_does_not_hear_its_own_messages(
    nats_url: str, subjects: Subjects
) -> None:
    config = RouterConfig(nats_url=nats_url, namespace=subjects.namespace)
    seen: list[bytes] = []

    async def on_msg(msg: Msg) -> None:
        seen.append(msg.data)

    async with serving(config, "router", lambda nc: Router(config, nc)) as router:
        own = router._nc
        assert own.options["no_echo"]
        subject = f"{subjects.namespace}.echo"
        await own.subscribe(subject, cb=on_msg)
        await own.publish(subject, b"mine")
        await own.flush()
        await asyncio.sleep(0.2)
    assert seen == []


async def test_a_publish_on_a_socket_closed_under_it_waits_for_the_reconnect(
    nats_url: str,
) -> None:
    sender = await connect(nats_url, name="closed-test")
    try:
        assert isinstance(sender, DirectClient)
        writer = sender._direct_writer()
        assert writer is not None
        writer.transport.abort()  # what a killed server leaves before nats-py notices
        await sender.publish("closed.test", b"kept")  # must not raise into the caller
        assert sender._direct_writer() is None
    finally:
        with contextlib.suppress(ConnectionError):  # nats-py drains the aborted socket
            await sender.close()
