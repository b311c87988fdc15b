"""Catch NATS "no responders" for messages a service forwards, and act on them by request id.

nats-server answers a publish that nobody receives with a 503 status message, but only to the
*publishing* connection's subscription on the reply subject. So a hop that forwards a request
(preprocessor → router, router → worker) sets the reply subject to its own per-instance bounce
subject and keeps a little context per request for a few seconds; a bounce calls ``on_bounce``
(tell the formatter, or retry another worker). Costs nothing unless a hop is missing.

``Unreachable`` is the same without the context: for messages sent many times per request
(token batches, response chunks), whose sender can look the request up by its id itself.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.bus import no_responders
from shared.subjects import Subjects, request_id_of

log = structlog.get_logger(__name__)

C = TypeVar("C")
KEEP_S = 5.0
"""A bounce comes back within milliseconds; context older than this is dropped."""


class Unreachable:
    """Per-instance bounce subject; a bounce calls ``on_bounce(request_id, subject)``."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        on_bounce: Callable[[str, str], Awaitable[None]],
        *,
        instance_id: str | None = None,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._on_bounce = on_bounce
        self.instance = instance_id or uuid.uuid4().hex[:12]
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(
            self._subjects.bounce_all(self.instance), cb=self._on_msg
        )

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    def reply_for(self, request_id: str) -> str:
        """The reply subject to publish ``request_id``'s messages with."""
        return self._subjects.bounce(self.instance, request_id)

    async def _on_msg(self, msg: Msg) -> None:
        missing = no_responders(msg)
        if missing is not None:
            await self._on_bounce(request_id_of(msg.subject), missing)


class Bounces(Generic[C]):
    """An ``Unreachable`` subject plus the context of recently forwarded requests."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        on_bounce: Callable[[str, C, str], Awaitable[None]],
        *,
        instance_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_bounce = on_bounce
        self._clock = clock
        self._pending: dict[str, tuple[float, C]] = {}
        self._last_sweep = clock()
        self._subject = Unreachable(nc, subjects, self._bounced, instance_id=instance_id)

    async def start(self) -> None:
        await self._subject.start()

    async def stop(self) -> None:
        await self._subject.stop()

    def reply_for(self, request_id: str, context: C) -> str:
        """Remember ``context`` for ``request_id``; returns the reply subject to publish with."""
        now = self._clock()
        self._pending[request_id] = (now, context)
        if now - self._last_sweep > 1.0:
            self._sweep(now)
        return self._subject.reply_for(request_id)

    def _sweep(self, now: float) -> None:
        self._last_sweep = now
        old = [rid for rid, (at, _) in self._pending.items() if now - at > KEEP_S]
        for rid in old:
            del self._pending[rid]

    async def _bounced(self, request_id: str, missing: str) -> None:
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return
        log.warning("no_responders", subject=missing)
        await self._on_bounce(request_id, entry[1], missing)
