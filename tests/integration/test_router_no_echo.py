"""A router's connection does not hear its own messages (``no_echo``): its decisions and
worker-lost notices, which it skips anyway, cost it no wake-up."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg

from services.router.config import RouterConfig
from services.router.service import Router
from shared.lifecycle import serving
from shared.subjects import Subjects


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
