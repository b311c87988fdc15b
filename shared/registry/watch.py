"""One KV bucket watched into memory: what the worker directory and the session store share.

The watch is an ordered push consumer on the bucket's stream: every key's latest value, then
every change, into the owner's callback. ``ready`` is set once the initial values are in (at
once for an empty bucket). A restarted nats-server forgets the consumer and nats-py notices
late, so the owner's guard asks ``alive`` now and then and calls ``watch`` again when it is not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.client import KV_PRE_TEMPLATE, KV_STREAM_TEMPLATE, JetStreamContext
from nats.js.kv import KV_DEL, KV_MARKER_REASON, KV_OP, KV_PURGE

from shared.bus import consumer_alive


class BucketWatch:
    """The watch of ``bucket`` into ``on_entry``."""

    def __init__(
        self, js: JetStreamContext, bucket: str, on_entry: Callable[[Msg], Awaitable[None]]
    ) -> None:
        self._js = js
        self.bucket = bucket
        self._on_entry = on_entry
        self._prefix = KV_PRE_TEMPLATE.format(bucket=bucket)
        self._sub: JetStreamContext.PushSubscription | None = None
        self.ready = asyncio.Event()

    async def watch(self) -> None:
        """(Re)subscribe; a failure leaves no subscription (``alive`` then says False)."""
        old, self._sub = self._sub, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.unsubscribe()
        sub = await self._js.subscribe(
            f"{self._prefix}>",
            stream=KV_STREAM_TEMPLATE.format(bucket=self.bucket),
            cb=self._on_entry,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        )
        self._sub = sub
        info = await sub.consumer_info()
        if info.num_pending == 0 and sub.delivered == 0:  # an empty bucket: nothing will come
            self.ready.set()

    def key(self, msg: Msg) -> str:
        """The key of a watched entry."""
        return msg.subject[len(self._prefix) :]

    def seen(self, msg: Msg) -> None:
        """After an entry: the initial values are in when none is pending."""
        if msg.metadata.num_pending == 0:
            self.ready.set()

    async def alive(self, timeout_s: float) -> bool | None:
        """Whether the server still has the watch (``None``: it could not be asked now)."""
        sub = self._sub  # None: the last attempt to watch again failed
        return False if sub is None else await consumer_alive(sub, timeout_s)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


def is_kv_removal(msg: Msg) -> bool:
    """A watched entry that says its key is gone (deleted, purged, or expired by a marker)."""
    headers = msg.headers or {}
    return not msg.data or headers.get(KV_OP) in (KV_DEL, KV_PURGE) or KV_MARKER_REASON in headers
