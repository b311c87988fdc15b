"""Which requests this formatter serves, and what to do with each event, open and cancel. Pure.

One request id goes through these states (decision 013; ``now`` is passed in, nothing here does
I/O, the service acts on what each method returns):

- **unknown** → *event* → **held** (early events kept, bounded) → *open* → **replaying**
- **unknown** or **held** → *direct open whose model's tokenizer is loading* → **loading**
  (its held events no longer age out) → *open* → **replaying**
- *open* with nothing held → **open** at once; **replaying** → *replayed* with nothing new held
  → **open** (events that came during the replay are held and replayed first: order is kept)
- **open** → *event* → delivered (the state is returned); idle too long → *expire* → **done**
- any → *end* (finished, failed, cancelled, its open failed) → **done**; **done** → *event*
  dropped, *open* ignored; after ``DONE_TTL_S`` → **unknown**
- **held** → older than ``MAX_AGE_S`` (from its first event) or evicted (``MAX_REQUESTS``) →
  **unknown** (its events dropped); at most ``MAX_EVENTS`` events are held per request
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

from shared.messages import WorkerEvent
from shared.recent import RecentIds

MAX_AGE_S = 2.0
"""Held events of a request whose open has not come (nor started loading) by then are dropped."""
MAX_REQUESTS = 1024
"""Requests waiting for their open at most. When full, the oldest merely held one is evicted; if
every waiting request's open is under way, the new request's event is dropped instead."""
MAX_EVENTS = 256
"""Per request; more than this many batches before the open means something else is wrong."""
DONE_TTL_S = 10.0
"""Finished or cancelled request ids are remembered this long: their late batches are dropped at
once instead of being held, and a ``StreamOpen`` that comes after its ``Cancel`` is ignored."""


class Tracked(Protocol):
    """What the table needs of a request's formatting state: when it last saw a batch."""

    last_seen: float


S = TypeVar("S", bound=Tracked)


@dataclass(frozen=True, slots=True)
class Held:
    """The event is kept until its request's open; ``evicted`` lost its held events for room."""

    evicted: str | None = None


@dataclass(frozen=True, slots=True)
class Dropped:
    """The event is dropped: its request is ``done``, or there is no room to hold it."""

    reason: Literal["finished", "too_many_requests", "too_many_events"]


@dataclass(frozen=True, slots=True)
class Replay:
    """The open is accepted: deliver ``events`` (held early) in order, then ask ``replayed``."""

    events: tuple[WorkerEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class Ignore:
    """The open creates no state: the request is over (``cancelled``) or already open."""

    reason: Literal["cancelled", "duplicate"]


@dataclass(slots=True)
class Expired(Generic[S]):
    """What ``expire`` ended: open requests idle too long (to fail), held ones aged out."""

    idle: list[tuple[str, S]] = field(default_factory=list)
    early: list[str] = field(default_factory=list)


HELD = Held()
OPENED = Replay()
_FINISHED = Dropped("finished")
_TOO_MANY_REQUESTS = Dropped("too_many_requests")
_TOO_MANY_EVENTS = Dropped("too_many_events")

_Phase = Literal["held", "loading", "replaying"]
Phase = Literal["unknown", "held", "loading", "replaying", "open", "done"]


@dataclass(slots=True)
class _Waiting(Generic[S]):
    """A request not open yet: its early events and how far its open has got."""

    since: float
    """When it was first seen (its first held event, or the start of its tokenizer load)."""
    phase: _Phase
    events: list[WorkerEvent] = field(default_factory=list)
    state: S | None = None
    """While ``replaying``: the state the held events are delivered to."""


class Streams(Generic[S]):
    """The requests of one formatter by id: open (with their state), waiting for an open, done."""

    __slots__ = (
        "_done",
        "_idle_s",
        "_max_age_s",
        "_max_events",
        "_max_requests",
        "_open",
        "_waiting",
    )

    def __init__(
        self,
        *,
        idle_timeout_s: float,
        max_age_s: float = MAX_AGE_S,
        max_requests: int = MAX_REQUESTS,
        max_events: int = MAX_EVENTS,
        done_ttl_s: float = DONE_TTL_S,
    ) -> None:
        self._idle_s = idle_timeout_s
        self._max_age_s = max_age_s
        self._max_requests = max_requests
        self._max_events = max_events
        self._open: dict[str, S] = {}
        self._waiting: dict[str, _Waiting[S]] = {}
        """Insertion order = age order, which ``expire`` relies on for ``held`` entries."""
        self._done = RecentIds(ttl_s=done_ttl_s)

    @property
    def in_flight(self) -> int:
        """Requests open (replayed, not yet ended)."""
        return len(self._open)

    @property
    def waiting(self) -> int:
        """Requests held, loading or replaying."""
        return len(self._waiting)

    def phase(self, request_id: str) -> Phase:
        """The state ``request_id`` is in (for tests and logs)."""
        if request_id in self._open:
            return "open"
        waiting = self._waiting.get(request_id)
        if waiting is not None:
            return waiting.phase
        return "done" if request_id in self._done else "unknown"

    def get(self, request_id: str) -> S | None:
        """The request's state, once it has one (open, or replaying its early events)."""
        state = self._open.get(request_id)
        if state is None and (waiting := self._waiting.get(request_id)) is not None:
            return waiting.state
        return state

    def open_requests(self) -> list[tuple[str, S]]:
        """The open requests, as a list (safe to end them while iterating)."""
        return list(self._open.items())

    # --- transitions -------------------------------------------------------------------------

    def on_event(self, event: WorkerEvent, now: float) -> S | Held | Dropped:
        """Its open request's state (deliver the event to it), or that it is held or dropped."""
        state = self._open.get(event.request_id)
        if state is not None:
            return state
        return self._hold(event, now)

    def _hold(self, event: WorkerEvent, now: float) -> Held | Dropped:
        request_id = event.request_id
        waiting = self._waiting.get(request_id)
        evicted = None
        if waiting is None:
            if request_id in self._done:
                return _FINISHED
            if len(self._waiting) >= self._max_requests:
                evicted = self._evict()
                if evicted is None:
                    return _TOO_MANY_REQUESTS
            waiting = self._waiting[request_id] = _Waiting(now, "held")
        if len(waiting.events) >= self._max_events:
            return _TOO_MANY_EVENTS
        waiting.events.append(event)
        return HELD if evicted is None else Held(evicted)

    def _evict(self) -> str | None:
        """Forget the oldest merely held request (never one whose open is under way)."""
        for request_id, waiting in self._waiting.items():
            if waiting.phase == "held":
                del self._waiting[request_id]
                return request_id
        return None

    def loading(self, request_id: str, now: float) -> None:
        """Its direct open waits for the model's tokenizer: keep its early events until then."""
        if request_id in self._open or request_id in self._done:
            return
        waiting = self._waiting.get(request_id)
        if waiting is None:
            self._waiting[request_id] = _Waiting(now, "loading")
        elif waiting.phase == "held":
            waiting.phase = "loading"

    def on_open(self, request_id: str, state: S) -> Replay | Ignore:
        """Its open came with ``state``: what to replay first, or why the open creates nothing."""
        if request_id in self._done:
            self._waiting.pop(request_id, None)
            return Ignore("cancelled")
        waiting = self._waiting.get(request_id)
        if request_id in self._open or (waiting is not None and waiting.phase == "replaying"):
            return Ignore("duplicate")
        if waiting is None or not waiting.events:
            self._waiting.pop(request_id, None)
            self._open[request_id] = state
            return OPENED
        events = tuple(waiting.events)
        waiting.events.clear()
        waiting.phase = "replaying"
        waiting.state = state
        return Replay(events)

    def replayed(self, request_id: str) -> tuple[WorkerEvent, ...]:
        """A replay round was delivered: the events held meanwhile, or ``()`` once it is open.

        Registering the state only when nothing is left to replay (with no await between this
        call and the last delivery's end) keeps newer events from overtaking held ones.
        """
        waiting = self._waiting.get(request_id)
        if waiting is None or waiting.phase != "replaying":
            return ()  # it ended during the replay (cancelled): nothing to register
        if waiting.events:
            events = tuple(waiting.events)
            waiting.events.clear()
            return events
        del self._waiting[request_id]
        assert waiting.state is not None  # set when it became replaying
        self._open[request_id] = waiting.state
        return ()

    def end(self, request_id: str, now: float) -> S | None:
        """The request is over (finished, failed, cancelled, open failed): remember it as done.

        Returns its state if it had one (open or replaying), for the caller to report.
        """
        state = self._open.pop(request_id, None)
        waiting = self._waiting.pop(request_id, None)
        if state is None and waiting is not None:
            state = waiting.state
        self._done.add(request_id, now)
        return state

    def expire(self, now: float) -> Expired[S]:
        """End open requests idle longer than ``idle_timeout_s``; drop held ones too old."""
        expired: Expired[S] = Expired()
        for request_id, waiting in list(self._waiting.items()):
            if waiting.phase != "held":
                continue  # its open is under way: its events wait for it
            if now - waiting.since <= self._max_age_s:
                break  # held entries are in age order: the rest are younger
            del self._waiting[request_id]
            expired.early.append(request_id)
        idle_s = self._idle_s
        for request_id, state in list(self._open.items()):
            if now - state.last_seen > idle_s:
                del self._open[request_id]
                self._done.add(request_id, now)
                expired.idle.append((request_id, state))
        return expired
