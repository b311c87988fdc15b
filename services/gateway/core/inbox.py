"""One request's replies at the gateway: the queue its reader waits on, the order of its numbered
chunks, and whether to ask who holds it (decision 018). No I/O; the clock is passed in.

The bus feeds an ``Inbox`` in arrival order and asks ``Probe`` when to send ``StreamResume``
(a hole, the bus back, a stall) and what an answer, or the lack of one, means for the request.
"""

from __future__ import annotations

import asyncio
from collections import deque

from services.gateway.core.errors import ClientTooSlow, StreamGap
from shared.errors import FormatterLost, ServiceError
from shared.messages import ResponseChunk, StreamHeld, TensorResult

ReplyItem = ResponseChunk | TensorResult | ServiceError

STALL_PROBE_S = 2.0
"""A request with no reply for this long is probed (who holds it?); so is each next one, at
least this far apart, while the silence lasts (a formatter answering ``StreamHeld`` for a long
non-streamed request is asked again every ``STALL_PROBE_S``)."""
HOLE_REASK_S = 0.5
"""A hole at the same chunk number is not asked about again sooner than this: the replay asked
for may still be on its way."""
UNANSWERED_LIMIT = 2
"""Unanswered probes in a row before a request that has received nothing is given up as lost
(then resubmitted): one alone may be a message lost on the way."""
HOLDER_FORMATTER = "formatter"


class Inbox:
    """One request's replies in arrival order, with at most one waiter.

    ``asyncio.Queue`` plus ``asyncio.timeout`` per wait cost more than this needs: one
    consumer, a timeout on every wait. Here a wait is one future and one timer. The bytes
    waiting for a slow client are bounded: past ``max_bytes`` the queue is dropped for one
    ``ClientTooSlow`` error, and later replies are ignored. The bus puts a chunk in only when
    its ``seq`` is ``next_seq`` (``admit``).
    """

    __slots__ = ("_bytes", "_items", "_waiter", "max_bytes", "next_seq", "probe", "unreachable")

    def __init__(
        self,
        unreachable: str = "No preprocessor is running.",
        max_bytes: int = 0,
        probe: Probe | None = None,
    ) -> None:
        self._items: deque[ReplyItem] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._bytes = 0
        self.max_bytes = max_bytes
        """0 = no bound."""
        self.unreachable = unreachable
        """The error message when NATS answers "no responders" for this request."""
        self.next_seq = 0
        """The ``seq`` of the chunk this request expects next (decision 018)."""
        self.probe = probe
        """Who-holds-it state; ``None`` for a request no formatter serves (tensor)."""

    def admit(self, seq: int) -> bool:
        """Whether chunk ``seq`` is the one in turn (then it is counted); else drop it."""
        if seq != self.next_seq:
            return False
        self.next_seq = seq + 1
        return True

    def restart(self, now: float) -> None:
        """The request was resubmitted under a new id: its chunks count from 0 again."""
        self.next_seq = 0
        if self.probe is not None:
            self.probe.restart(now)

    def put_nowait(self, item: ReplyItem) -> None:
        if self._bytes < 0:
            return  # overflowed: the request is being ended
        if isinstance(item, ResponseChunk):
            self._bytes += len(item.data)
            if self.max_bytes and self._bytes > self.max_bytes:
                self._items.clear()
                self._bytes = -1
                item = ClientTooSlow(
                    f"The client read too slowly: over {self.max_bytes} bytes were waiting."
                )
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> ReplyItem:
        item = self._items.popleft()
        if isinstance(item, ResponseChunk) and self._bytes > 0:
            self._bytes -= len(item.data)
        return item

    async def wait(self, timeout_s: float) -> bool:
        """Wait until an item is in (True) or ``timeout_s`` has passed (False)."""
        if self._items:
            return True
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return bool(self._items)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Probe:
    """When to ask who holds a request (``StreamResume``), and what the answer means.

    At most one probe is in flight (``asking`` is its token). The bus's sweeper calls
    ``is_stalled`` every half second; progress is seen there, not on the per-chunk path.
    """

    __slots__ = (
        "asked_at",
        "asked_seq",
        "asking",
        "has_formatter",
        "is_over",
        "quiet_since",
        "seen_seq",
        "unanswered",
    )

    def __init__(self, now: float) -> None:
        self.asking = 0
        """The token of the probe in flight; 0 = none."""
        self.restart(now)

    def restart(self, now: float) -> None:
        """A new request, or a resubmission: nobody has answered for this attempt yet
        (``asking`` stays: a probe in flight for the old attempt is still one in flight)."""
        self.asked_seq = -1
        self.asked_at = float("-inf")
        self.quiet_since = now
        """Since when nothing was heard: no new chunk, no ``StreamHeld``."""
        self.seen_seq = 0
        """``next_seq`` when the sweeper last looked."""
        self.unanswered = 0
        """Probes in a row nobody answered."""
        self.has_formatter = False
        """A formatter answered for it once: its stream was set up."""
        self.is_over = False
        """An end was put in the inbox (done, an error): ask nothing more."""

    def may_ask_hole(self, next_seq: int, now: float) -> bool:
        """Whether a hole at ``next_seq`` is worth a probe now (none in flight, not just asked)."""
        if self.is_over or self.asking:
            return False
        return self.asked_seq != next_seq or now - self.asked_at >= HOLE_REASK_S

    def is_stalled(self, next_seq: int, now: float) -> bool:
        """Whether the request has been silent ``STALL_PROBE_S`` since its last sign or probe."""
        if next_seq != self.seen_seq:
            self.seen_seq = next_seq
            self.quiet_since = now
            return False
        if self.is_over or self.asking:
            return False
        return now - self.quiet_since >= STALL_PROBE_S and now - self.asked_at >= STALL_PROBE_S

    def begin(self, token: int, from_seq: int, now: float) -> None:
        """A probe from ``from_seq`` goes out (it supersedes one still in flight)."""
        self.asking = token
        self.asked_seq = from_seq
        self.asked_at = now

    def finish(self, token: int) -> bool:
        """The probe ``token`` is back; whether it is still the current one (else ignore it)."""
        if self.asking != token:
            return False
        self.asking = 0
        return True

    def on_held(self, held: StreamHeld, from_seq: int, now: float) -> ServiceError | None:
        """Someone holds the request: it is alive. An error when the chunks from ``from_seq``
        are gone from the formatter's history (the stream cannot go on without a hole)."""
        self.unanswered = 0
        self.quiet_since = now
        if held.holder != HOLDER_FORMATTER:
            return None
        self.has_formatter = True
        if held.first_seq > from_seq:
            self.is_over = True
            return StreamGap(from_seq=from_seq, first_seq=held.first_seq)
        return None

    def on_unanswered(self, from_seq: int, next_seq: int) -> ServiceError | None:
        """Nobody answered a probe from ``from_seq``: lost at once if it had a stream, else at
        the second time; never when chunks came meanwhile (``next_seq`` past ``from_seq``):
        the request is alive, its holder just could not answer in time (a node of the cluster
        going away under the probe, a busy preprocessor)."""
        if next_seq > from_seq:
            self.unanswered = 0
            return None
        self.unanswered += 1
        if next_seq == 0 and not self.has_formatter and self.unanswered < UNANSWERED_LIMIT:
            return None
        self.is_over = True
        return FormatterLost(
            "The request was lost in transit: no formatter or preprocessor holds it any more."
        )

    def end(self) -> None:
        """The request is ending (its last chunk or an error is in): stop probing it."""
        self.is_over = True
