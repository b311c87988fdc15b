"""What ``jetserve top`` reads: bus subscriptions (load, lifecycle, KV events, routing decisions,
token batches), the workers bucket (live worker cards) and the services' ``/metrics``.

Core NATS subscriptions only see what flows from now on; the bucket watch gives every live card
at once. ``/metrics`` is fetched with ``urllib`` in a thread (no HTTP client dependency). The
figures are made in ``frame``; this module only gathers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.cli.top.events import KEEP_S, BusEvents
from services.cli.top.frame import Frame, build_frame
from services.cli.top.stats import Scrape, parse
from shared import codec
from shared.messages import KvEventBatch, RequestPhase, RouteDecision, TokenBatch, WorkerLoad
from shared.metric_names import DEFAULT_PREFIX
from shared.registry import WorkerDirectory
from shared.subjects import Subjects

SCRAPE_TIMEOUT_S = 2.0
STREAM_PENDING_MSGS = 1_000_000
"""Token batches buffered before the server drops some for ``top`` (a slow consumer): the
figures then undercount, the services are not slowed."""


class Feed:
    """Gathers for ``top``: subscribe with ``start``, ``scrape`` ``/metrics`` now and then,
    ``frame`` whenever a screen is due."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        metrics_urls: Sequence[str],
        *,
        metrics_prefix: str = DEFAULT_PREFIX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nc = nc
        self._metrics_prefix = metrics_prefix
        self._subjects = subjects
        self._clock = clock
        self.events = BusEvents()
        self.scrapes: dict[str, deque[Scrape]] = {url: deque(maxlen=256) for url in metrics_urls}
        self.directory: WorkerDirectory | None = None
        self.cards_error = ""
        """Why the workers bucket could not be read (empty: it is watched)."""
        self.started_at = clock()
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        """Subscribe to the bus and load the live worker cards."""
        s = self._subjects
        handlers: list[tuple[str, Callable[[bytes, float], None]]] = [
            (s.load_all, self._typed(WorkerLoad, self.events.on_load)),
            (s.lifecycle_all, self._typed(RequestPhase, self.events.on_phase)),
            (s.kv_events_all, self._typed(KvEventBatch, self.events.on_kv)),
            (s.decisions, self._typed(RouteDecision, self.events.on_decision)),
            (s.stream_all("*"), self._on_stream),
        ]
        for subject, handle in handlers:
            self._subs.append(
                await self._nc.subscribe(
                    subject,
                    cb=self._callback(handle),
                    pending_msgs_limit=STREAM_PENDING_MSGS,
                    pending_bytes_limit=-1,
                )
            )
        await self._nc.flush()
        directory = WorkerDirectory(self._nc.jetstream(), s)
        try:
            await directory.start()
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            self.cards_error = f"{type(exc).__name__}: {exc}"
        else:
            self.directory = directory
        self.started_at = self._clock()

    async def stop(self) -> None:
        if self.directory is not None:
            await self.directory.stop()
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    def _callback(self, handle: Callable[[bytes, float], None]) -> Callable[[Msg], Awaitable[None]]:
        async def on_msg(msg: Msg) -> None:
            with contextlib.suppress(msgspec.DecodeError):  # another version's message
                handle(msg.data, self._clock())

        return on_msg

    @staticmethod
    def _typed(
        kind: type[Any], handle: Callable[[Any, float], None]
    ) -> Callable[[bytes, float], None]:
        decoder = codec.decoder(kind)
        return lambda data, at: handle(decoder.decode(data), at)

    def _on_stream(self, data: bytes, at: float) -> None:
        event = codec.WORKER_EVENTS.decode(data)
        if isinstance(event, TokenBatch):
            self.events.on_tokens(event, at)

    async def scrape(self) -> None:
        """Fetch every ``/metrics`` URL once, together."""
        if self.scrapes:
            await asyncio.gather(*(self._scrape(url) for url in self.scrapes))

    async def _scrape(self, url: str) -> None:
        at = self._clock()
        try:
            text = await asyncio.to_thread(_fetch, url)
            scrape = Scrape(url, at, parse(text, self._metrics_prefix))
        except (OSError, ValueError, urllib.error.URLError) as exc:
            scrape = Scrape(url, at, error=str(getattr(exc, "reason", exc)))
        self.scrapes[url].append(scrape)

    def frame(self, window_s: float) -> Frame:
        """The screen as of now."""
        now = self._clock()
        self.events.expire(now)
        cards = {}
        if (directory := self.directory) is not None:
            cards = {wid: c for wid, c in directory.view.cards.items() if directory.is_live(c)}
        for history in self.scrapes.values():
            while history and history[0].at < now - KEEP_S:
                history.popleft()
        return build_frame(
            self.events,
            cards,
            self.scrapes,
            now=now,
            started_at=self.started_at,
            window_s=window_s,
        )


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as resp:
        body: bytes = resp.read()
    return body.decode("utf-8", errors="replace")
