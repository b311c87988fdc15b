"""The reader side of worker cards: ``WorkerDirectory`` (model files: ``model_files.py``).

A directory watches the workers bucket and expires cards by TTL locally, because max-age
expiry sends watchers nothing. A restarted nats-server forgets the watch's consumer: the
directory notices within a second or so, watches again (a fresh view of every key) and does
not count the time it could not see the bucket against any card.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from shared import codec
from shared.messages import WorkerCard
from shared.registry.layout import (
    DEFAULT_WORKER_TTL_S,
    workers_bucket,
)
from shared.registry.watch import BucketWatch, is_kv_removal
from shared.subjects import Subjects
from shared.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

WATCH_CHECK_S = 1.0
"""How often the directory asks the server whether its watch still exists."""
WATCH_CHECK_TIMEOUT_S = 1.0
MAX_BLIND_SPANS = 8


def is_live(card: WorkerCard, now: float, ttl_s: float) -> bool:
    """A card is live while its last heartbeat is younger than the TTL."""
    return now - card.heartbeat_at < ttl_s


@dataclass
class _ModelView:
    """One model's live cards, kept between calls while nothing can have changed them."""

    cards: list[WorkerCard]
    """By worker id; a heartbeat replaces its worker's card in place."""
    at: dict[str, int]
    """Worker id -> index in ``cards``."""
    built_at: float
    valid_until: float
    """The first moment a listed card may have expired."""


@dataclass
class LiveWorkers:
    """Worker cards seen so far, by id. Pure: the clock is passed in.

    While the bucket cannot be watched (NATS down, the watch lost) no heartbeat can be seen,
    so that time does not count against a card: otherwise an outage longer than the TTL would
    look like every worker dying at once.

    ``for_model`` is asked once per request, so it keeps each model's list between calls: a
    card that arrives or leaves, a change of blind state, or the first expiry of a listed card
    rebuilds it; a heartbeat only replaces its card in the list. A thousand workers cost one
    walk per change, not one per request.
    """

    ttl_s: float
    cards: dict[str, WorkerCard] = field(default_factory=dict)
    blind: list[tuple[float, float]] = field(default_factory=list)
    """Past spans of time when the bucket could not be watched."""
    blind_since: float | None = None
    """When the current blind span began (``None`` = watching)."""
    _views: dict[str, _ModelView] = field(default_factory=dict, repr=False)

    def put(self, card: WorkerCard) -> None:
        old = self.cards.get(card.worker_id)
        self.cards[card.worker_id] = card
        view = self._views.get(card.model)
        if view is not None and old is not None and _same_but_heartbeat(old, card):
            at = view.at.get(card.worker_id)
            if at is not None:  # listed, and stays so a while longer
                view.cards[at] = card
                return
        self._forget(card, old)

    def remove(self, worker_id: str) -> WorkerCard | None:
        old = self.cards.pop(worker_id, None)
        if old is not None:
            self._forget(old)
        return old

    def _forget(self, *cards: WorkerCard | None) -> None:
        for card in cards:
            if card is not None:
                self._views.pop(card.model, None)

    def go_blind(self, now: float) -> bool:
        """The bucket cannot be watched from ``now``; True when it could until now."""
        if self.blind_since is not None:
            return False
        self.blind_since = now
        self._views.clear()
        return True

    def see(self, now: float) -> bool:
        """The bucket is watched again; True when it was not (the blind span is kept)."""
        if self.blind_since is None:
            return False
        self.blind.append((self.blind_since, now))
        del self.blind[:-MAX_BLIND_SPANS]
        self.blind_since = None
        self._views.clear()
        return True

    def age(self, card: WorkerCard, now: float) -> float:
        """Seconds since the card's heartbeat, less the blind time since then."""
        spans = self.blind if self.blind_since is None else [*self.blind, (self.blind_since, now)]
        unseen = sum(
            max(0.0, min(end, now) - max(start, card.heartbeat_at)) for start, end in spans
        )
        return now - card.heartbeat_at - unseen

    def is_live(self, card: WorkerCard, now: float) -> bool:
        """A card is live while its age (blind time excused) is under the TTL."""
        return self.age(card, now) < self.ttl_s

    def for_model(self, model: str, now: float) -> list[WorkerCard]:
        """Live workers serving ``model``, ordered by worker id (stable for round-robin).

        The same list object while the model's live workers stay the same (routers key their
        per-fleet state on it): read it, never change it.
        """
        view = self._views.get(model)
        if view is None or not view.built_at <= now < view.valid_until:
            view = self._build(model, now)
        return view.cards

    def _build(self, model: str, now: float) -> _ModelView:
        live = sorted(
            (c for c in self.cards.values() if c.model == model and self.is_live(c, now)),
            key=lambda c: c.worker_id,
        )
        # Ages grow with time only while watching: blind, rebuild on every call.
        if self.blind_since is not None:
            valid_until = now
        else:
            valid_until = min((now + self.ttl_s - self.age(c, now) for c in live), default=math.inf)
        view = _ModelView(
            cards=live,
            at={c.worker_id: i for i, c in enumerate(live)},
            built_at=now,
            valid_until=valid_until,
        )
        self._views[model] = view
        return view

    def models(self, now: float) -> set[str]:
        """Models with at least one live worker."""
        return {c.model for c in self.cards.values() if self.is_live(c, now)}


def _same_but_heartbeat(old: WorkerCard, new: WorkerCard) -> bool:
    """A heartbeat: the same worker, settings and start, a later beat."""
    return (
        new.heartbeat_at >= old.heartbeat_at
        and msgspec.structs.replace(old, heartbeat_at=new.heartbeat_at) == new
    )


class WorkerDirectory:
    """Keeps a ``LiveWorkers`` view in sync with the workers bucket through a KV watch.

    The watch is an ordered push consumer on the bucket's stream (every key's latest value,
    then every change); a guard task asks the server for it every ``WATCH_CHECK_S`` and watches
    again when the server has lost it.
    """

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        *,
        ttl_s: float = DEFAULT_WORKER_TTL_S,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._clock = clock
        self._on_change = on_change
        self.view = LiveWorkers(ttl_s=ttl_s)
        self._watch = BucketWatch(js, subjects.workers_bucket, self._on_entry)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the bucket and start watching; returns once the initial values are loaded."""
        await workers_bucket(self._js, self._subjects, self.view.ttl_s)
        await self._watch.watch()
        await asyncio.wait_for(self._watch.ready.wait(), timeout=10)
        self._task = asyncio.create_task(self._guard(), name="worker-directory")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
        await self._watch.stop()

    async def _on_entry(self, msg: Msg) -> None:
        """Every key's latest value, then every change, into ``view``."""
        key = self._watch.key(msg)
        if is_kv_removal(msg):
            if self.view.remove(key) is not None:
                log.info("worker_deregistered", worker_id=key)
        else:
            try:
                self._put(codec.decode(msg.data, WorkerCard))
            except codec.DecodeError as exc:
                log.warning("bad_worker_card", key=key, error=str(exc))
        self._watch.seen(msg)
        if self._on_change is not None:
            self._on_change()

    def _put(self, card: WorkerCard) -> None:
        if card.worker_id not in self.view.cards:
            log.info("worker_registered", worker_id=card.worker_id, model=card.model)
        self.view.put(card)

    async def _guard(self) -> None:
        """Forever: check the watch; when the server lost it, watch again (a fresh view)."""
        while True:
            await asyncio.sleep(WATCH_CHECK_S)
            alive = await self._watch.alive(WATCH_CHECK_TIMEOUT_S)
            if alive:
                if self.view.see(self._clock()):
                    log.info("worker_directory_watching")
                continue
            if self.view.go_blind(self._clock()):
                log.warning("worker_directory_blind", watch_lost=alive is False)
            if alive is False:
                try:
                    # A server that lost its store lost the bucket too: the workers' next
                    # heartbeats fill it again.
                    await workers_bucket(self._js, self._subjects, self.view.ttl_s, retry_s=0)
                    await self._watch.watch()
                    log.info("worker_directory_rewatched", workers=len(self.view.cards))
                except (nats.errors.Error, TimeoutError) as exc:
                    log.warning("worker_directory_rewatch_failed", error=repr(exc))

    def is_live(self, card: WorkerCard) -> bool:
        """Whether ``card`` is live right now (time the bucket could not be watched excused)."""
        return self.view.is_live(card, self._clock())

    def live(self, model: str) -> list[WorkerCard]:
        """Live workers for ``model`` right now."""
        return self.view.for_model(model, self._clock())

    def models(self) -> set[str]:
        """Models with at least one live worker right now."""
        return self.view.models(self._clock())
