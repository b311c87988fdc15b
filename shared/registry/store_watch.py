"""Follow an object store: ``on_change(name)`` for every object put or deleted from now on.

An ordered push consumer on the store's meta subjects, new messages only. A store that does not
exist yet, or a watch a restarted nats-server forgot, is watched again by a guard task that
checks every ``CHECK_S``. Changes made while nothing watched were not seen, so ``on_reset()`` is
called after every subscription, the first included: the owner drops all it cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.object_store import OBJ_ALL_META_PRE_TEMPLATE, OBJ_STREAM_TEMPLATE

from shared.bus import consumer_alive
from shared.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

CHECK_S = 1.0
"""How often the guard asks the server whether the watch still exists (or subscribes again)."""
CHECK_TIMEOUT_S = 1.0


class StoreWatch:
    """Calls ``on_change`` with each changed object's name, ``on_reset`` after each (re)watch."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        *,
        on_change: Callable[[str], None],
        on_reset: Callable[[], None],
    ) -> None:
        self._js = js
        self._bucket = bucket
        self._on_change = on_change
        self._on_reset = on_reset
        self._sub: JetStreamContext.PushSubscription | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Watch now if the store exists (else once it does, within ``CHECK_S``)."""
        await self._subscribe()
        self._task = asyncio.create_task(self._guard(), name=f"watch-{self._bucket}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    @property
    def is_watching(self) -> bool:
        return self._sub is not None

    async def _subscribe(self) -> None:
        old, self._sub = self._sub, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.unsubscribe()
        try:
            self._sub = await self._js.subscribe(
                OBJ_ALL_META_PRE_TEMPLATE.format(bucket=self._bucket),
                stream=OBJ_STREAM_TEMPLATE.format(bucket=self._bucket),
                cb=self._on_meta,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
            )
        except (nats.errors.Error, TimeoutError) as exc:  # no such store yet, or NATS away
            log.debug("store_watch_not_started", bucket=self._bucket, error=repr(exc))
            return
        log.info("store_watched", bucket=self._bucket)
        self._on_reset()

    async def _on_meta(self, msg: Msg) -> None:
        try:
            name = json.loads(msg.data)["name"]
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("store_watch_bad_meta", bucket=self._bucket, error=repr(exc))
            return
        if isinstance(name, str):
            self._on_change(name)

    async def _guard(self) -> None:
        """Forever: watch again when there is no watch, or the server lost it."""
        while True:
            await asyncio.sleep(CHECK_S)
            sub = self._sub
            if sub is not None and await consumer_alive(sub, CHECK_TIMEOUT_S) is not False:
                continue  # alive, or cannot be asked now (NATS away): ask again later
            await self._subscribe()
