"""Who holds this request? The gateway's side of decision 018: ``StreamResume`` request/reply on
the broadcast ``stream_resume`` subject, sent from background tasks (never from the reply
callback), and the sweeper that finds silent requests. ``inbox.Probe`` decides when to ask and
what an answer means; this module does the asking and puts the verdicts in the inboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

import structlog
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError

from services.gateway.core.inbox import Inbox
from shared import codec
from shared.messages import StreamHeld, StreamResume
from shared.subjects import Subjects
from shared.tasks import TaskSet

log = structlog.get_logger(__name__)

PROBE_TIMEOUT_S = 1.0
"""How long a ``StreamResume`` waits for ``StreamHeld``; no answer by then = nobody holds it."""
SWEEP_S = 0.5
"""How often in-flight requests are checked for silence (``inbox.STALL_PROBE_S``)."""
RECONNECT_SETTLE_S = 2.0
"""After this gateway's own reconnect, an unanswered probe proves nothing for this long: the
formatters and preprocessors may still be reconnecting (a restarted server). The sweeper asks
again ``STALL_PROBE_S`` after the first probe."""


class _CannotTell(Exception):
    """A probe that proves nothing: the connection failed, or the answer was undecodable."""


class Prober:
    """Sends the probes of one gateway's in-flight requests; at most one per request at once."""

    __slots__ = (
        "_back_at",
        "_epoch",
        "_is_up",
        "_nc",
        "_pending",
        "_subjects",
        "_sweeper",
        "_tasks",
        "_tokens",
    )

    def __init__(self, subjects: Subjects, pending: dict[str, Inbox]) -> None:
        self._subjects = subjects
        self._pending = pending
        """The bus's own map (request id -> inbox), read only here."""
        self._nc: Client | None = None
        self._is_up = False
        self._epoch = 0
        """Bumped at each connection loss: a probe that spans one proves nothing."""
        self._back_at = float("-inf")
        self._sweeper: asyncio.Task[None] | None = None
        self._tasks = TaskSet()
        """The probes in flight."""
        self._tokens = itertools.count(1)
        """Probe tokens, never 0 (``Probe.asking`` = 0 is "none")."""

    def start(self, nc: Client) -> None:
        """Probe through ``nc`` from now on; start the sweeper."""
        self._nc = nc
        self._is_up = True
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def stop(self) -> None:
        """Stop the sweeper and the probes in flight."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await self._tasks.close()

    def on_lost(self) -> None:
        """The connection dropped: probe nothing, and trust no probe now in flight."""
        self._is_up = False
        self._epoch += 1

    def on_back(self) -> None:
        """The connection is back: ask about every request in flight at once."""
        self._is_up = True
        now = self._back_at = time.monotonic()
        for request_id, inbox in list(self._pending.items()):
            probe = inbox.probe
            if probe is not None and not probe.is_over:
                self._ask(request_id, inbox, "bus_back", now)

    def on_hole(self, request_id: str, inbox: Inbox) -> None:
        """A chunk came past the next one expected: ask for a replay from the hole."""
        probe = inbox.probe
        now = time.monotonic()
        if self._is_up and probe is not None and probe.may_ask_hole(inbox.next_seq, now):
            self._ask(request_id, inbox, "hole", now)

    def sweep(self, now: float) -> None:
        """Probe every request that has been silent ``STALL_PROBE_S``."""
        if not self._is_up:
            return
        for request_id, inbox in list(self._pending.items()):
            probe = inbox.probe
            if probe is not None and probe.is_stalled(inbox.next_seq, now):
                self._ask(request_id, inbox, "stall", now)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            self.sweep(time.monotonic())

    def _ask(self, request_id: str, inbox: Inbox, reason: str, now: float) -> None:
        assert inbox.probe is not None
        token = next(self._tokens)
        from_seq = inbox.next_seq
        inbox.probe.begin(token, from_seq, now)
        log.debug("stream_resume_asked", request_id=request_id, from_seq=from_seq, reason=reason)
        self._tasks.spawn(self._probe(request_id, inbox, token, from_seq))

    async def _probe(self, request_id: str, inbox: Inbox, token: int, from_seq: int) -> None:
        """One probe: ask, then put the verdict in the inbox if it ends the request."""
        probe = inbox.probe
        assert probe is not None
        epoch = self._epoch
        try:
            answer = await self._held(request_id, from_seq)
        except _CannotTell:
            return
        finally:
            is_current = probe.finish(token)
        if not is_current or self._pending.get(request_id) is not inbox:
            return  # superseded, or the request ended / was resubmitted meanwhile
        now = time.monotonic()
        if epoch != self._epoch or not self._is_up:
            return  # the connection was lost meanwhile: the answer may have been too
        if answer is None and now - self._back_at < RECONNECT_SETTLE_S:
            return
        if answer is not None:
            error = probe.on_held(answer, from_seq, now)
        else:
            error = probe.on_unanswered(from_seq, inbox.next_seq)
        if error is not None:
            log.warning(
                "request_lost_in_transit",
                request_id=request_id,
                code=error.code,
                from_seq=from_seq,
                next_seq=inbox.next_seq,
                detail=error.message,
            )
            inbox.put_nowait(error)

    async def _held(self, request_id: str, from_seq: int) -> StreamHeld | None:
        """The holder's ``StreamHeld``; ``None`` = nobody holds it; ``_CannotTell`` raised."""
        if self._nc is None:
            raise _CannotTell
        resume = codec.encode(StreamResume(request_id=request_id, from_seq=from_seq))
        try:
            msg = await self._nc.request(
                self._subjects.stream_resume, resume, timeout=PROBE_TIMEOUT_S
            )
        except (NoRespondersError, TimeoutError):
            return None  # nats-py's TimeoutError is a TimeoutError too
        except NatsError as exc:
            log.debug("stream_resume_failed", request_id=request_id, error=repr(exc))
            raise _CannotTell from exc
        try:
            return codec.decode(msg.data, StreamHeld)
        except codec.DecodeError as exc:
            log.warning(
                "message_undecodable", kind="stream_held", request_id=request_id, error=str(exc)
            )
            raise _CannotTell from exc
