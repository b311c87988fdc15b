"""A worker's presence on the bus: its cards in the registry and the subscriptions they stand for.

Every worker, with an engine (``runtime.WorkerRuntime``) or without (``simple.SimpleWorker``),
joins and leaves in the same order: subscribe, wait until the server has every subscription,
then register (a worker card means "ready"); on the way out, delete the cards first, so routers
stop sending here before the subscriptions go.
"""

from __future__ import annotations

import contextlib

import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from shared.bus import barrier
from shared.handlers import Callback
from shared.messages import WorkerCard
from shared.registry import WorkerRegistration
from shared.subjects import Subjects


class WorkerPresence:
    """The cards and subscriptions of one worker (or of several sharing a connection)."""

    def __init__(self, nc: Client, subjects: Subjects, *, ttl_s: float, replicas: int) -> None:
        self._nc = nc
        self._subjects = subjects
        self._ttl_s = ttl_s
        self._replicas = replicas
        self._registrations: list[WorkerRegistration] = []
        self.subs: list[Subscription] = []
        """In subscription order."""

    def add_card(self, card: WorkerCard) -> None:
        """Register ``card`` on ``announce``; it is heartbeated every TTL/3 until ``withdraw``."""
        self._registrations.append(
            WorkerRegistration(
                self._nc.jetstream(),
                self._subjects,
                card,
                ttl_s=self._ttl_s,
                replicas=self._replicas,
            )
        )

    def card(self, worker_id: str) -> WorkerCard:
        """The card registered (or to be) for ``worker_id``."""
        return next(r.card for r in self._registrations if r.card.worker_id == worker_id)

    async def update_card(self, card: WorkerCard) -> None:
        """Replace the card of ``card.worker_id`` (put at once once announced)."""
        for registration in self._registrations:
            if registration.card.worker_id == card.worker_id:
                await registration.update(card)

    async def subscribe(self, subject: str, callback: Callback) -> Subscription:
        """Subscribe ``callback`` to ``subject`` (kept for ``unsubscribe``)."""
        sub = await self._nc.subscribe(subject, cb=callback)
        self.subs.append(sub)
        return sub

    async def announce(self) -> None:
        """Once the server has every subscription made so far, register the cards."""
        await barrier(self._nc)
        for registration in self._registrations:
            await registration.start()

    async def withdraw(self) -> None:
        """Delete the cards (the worker leaves the registry at once); subscriptions stay."""
        for registration in self._registrations:
            await registration.stop()

    async def unsubscribe(self) -> None:
        """Drop every subscription (one the connection already lost is skipped)."""
        for sub in self.subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self.subs.clear()
