"""Formatter I/O of decision 018: replay chunks on ``StreamResume``, ask workers about stalls.

What to keep and when to ask is decided by pure code (``replay.py`` holds the chunks,
``RequestFormatter.awaits_stall_check`` says when a request is due a check); this module
subscribes, answers, asks and sends again. Migration itself stays with the service (passed in).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import bound_contextvars

from services.formatter.migration import NotMigrated
from services.formatter.replay import ChunkHistory, FinishedStreams
from services.formatter.request import RequestFormatter
from services.formatter.streams import Streams
from shared import codec
from shared.bounce import Unreachable
from shared.handlers import Boundary
from shared.messages import (
    RouteQuery,
    RouteStatus,
    StreamHeld,
    StreamResume,
    WorkerPing,
    WorkerPong,
)
from shared.subjects import Subjects
from shared.tasks import TaskSet

log = structlog.get_logger(__name__)

ROUTE_QUERY_TIMEOUT_S = 1.0
"""How long a ``RouteQuery`` waits for a router's answer."""
STALL_CHECK_S = 2.0
"""A routed request with no batch this long: ask its worker whether it still holds it."""
PING_TIMEOUT_S = 1.0
"""How long a ``WorkerPing`` waits; no answer teaches nothing (routers judge hung workers)."""
GATEWAY_GRACE_S = 5.0
"""A request whose chunk bounced is ended (and its worker cancelled) after this long without a
``StreamResume``: its gateway may be moving to another NATS node."""
RECONNECT_GRACE_S = 2.0
"""After this formatter's own reconnect, "no responders" from a worker is not believed this
long: workers on the node we lost reconnect a moment after us (as routers do, decision 017)."""
STREAM_RESUME = codec.decoder(StreamResume)
WORKER_PONG = codec.decoder(WorkerPong)

TryMigrate = Callable[[RequestFormatter, str, str], Awaitable[NotMigrated | None]]
"""The service's migration ``(state, from_worker, reason)``: why not, when it may not move."""
Move = Callable[[RequestFormatter, str, str], Awaitable[None]]
"""The service's migration that fails the request when it may not move."""


@dataclass(frozen=True, slots=True)
class _Held:
    """What a ``StreamResume`` gets here: the answer's numbers and what to send again where."""

    reply_to: str
    first_seq: int
    next_seq: int
    chunks: list[bytes]
    bounce: str
    """Reply subject of the resent chunks ("" = none: the request is over)."""


_NOTHING_YET = ChunkHistory()
"""The history of a request whose open waits for its tokenizer: nothing sent yet."""


class Recovery:
    """Replays what a gateway missed, and finds requests whose worker no longer holds them."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        streams: Streams[RequestFormatter],
        *,
        boundary: Boundary,
        unreachable: Unreachable,
        migrate: TryMigrate,
        move: Move,
        tasks: TaskSet,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._streams = streams
        self._boundary = boundary
        self._unreachable = unreachable
        self._migrate = migrate
        self._move = move
        self._tasks = tasks
        self._clock = clock
        self.finished = FinishedStreams()
        """Ended requests' histories, for a gateway that lost their last chunk."""
        self._reconnected_at = -math.inf
        self._sub: Subscription | None = None

    async def start(self) -> None:
        """Take ``StreamResume`` (no queue group: only the formatter holding it answers)."""
        self._sub = await self._nc.subscribe(self._subjects.stream_resume, cb=self._on_resume_msg)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    def keep(self, state: RequestFormatter, *, tail: bytes | None = None) -> None:
        """The request ended: keep what it sent (and its failure) for a late ``StreamResume``."""
        self.finished.add(
            state.open.request_id, state.open.reply_to, state.history, self._clock(), tail=tail
        )

    # --- StreamResume --------------------------------------------------------------------------

    async def _on_resume_msg(self, msg: Msg) -> None:
        try:
            resume = STREAM_RESUME.decode(msg.data)
        except codec.DecodeError as exc:
            # Not answered: an answer would be taken as "held here"; silence is the safe reply.
            self._boundary.metrics.error("message_undecodable")
            log.warning(
                "message_undecodable", subject=msg.subject, kind="stream_resume", error=str(exc)
            )
            return
        held = self._held(resume)
        if held is None:
            return  # another formatter's, or nobody's: silence says so
        reply = msg.reply

        async def answer(request: StreamResume) -> None:
            await self._resume(request, held, reply)

        await self._boundary.wrap("stream_resume", answer)(resume)

    def _held(self, resume: StreamResume) -> _Held | None:
        """What this formatter holds of the request: in flight, opening, or ended recently."""
        request_id, from_seq = resume.request_id, resume.from_seq
        state = self._streams.get(request_id)
        if state is not None:
            history = state.history
            bounce = self._unreachable.reply_for(request_id)
            return _Held(state.open.reply_to, *_numbers(history), history.since(from_seq), bounce)
        finished = self.finished.get(request_id, self._clock())
        if finished is not None:
            numbers = _numbers(finished.history)
            return _Held(finished.reply_to, *numbers, finished.replay(from_seq), "")
        if self._streams.phase(request_id) == "loading":
            return _Held("", *_numbers(_NOTHING_YET), [], "")
        return None

    async def _resume(self, resume: StreamResume, held: _Held, reply: str) -> None:
        """Answer ``StreamHeld``, then send the chunks again in order; the gateway is back."""
        state = self._streams.get(resume.request_id)
        if state is not None:
            state.gateway_away_since = None
        nc = self._nc
        if reply:
            answer = StreamHeld(
                request_id=resume.request_id,
                holder="formatter",
                first_seq=held.first_seq,
                next_seq=held.next_seq,
            )
            await nc.publish(reply, codec.encode(answer))
        # Publishing does not yield while the client's buffer has room, so no newer chunk of
        # the request gets in between; if it ever does, the gateway sees a hole and asks again.
        for chunk in held.chunks:
            await nc.publish(held.reply_to, chunk, reply=held.bounce)
        log.info(
            "stream_resumed",
            from_seq=resume.from_seq,
            first_seq=held.first_seq,
            next_seq=held.next_seq,
            resent=len(held.chunks),
        )

    # --- was it routed? (RouteQuery, decision 017) ---------------------------------------------

    def check_routed(self, state: RequestFormatter) -> None:
        """Ask the routers, in a task, whether the attempt was routed (no token for a while)."""
        self._tasks.spawn(self._check_routed(state), name=f"route-check-{state.open.request_id}")

    async def _check_routed(self, state: RequestFormatter) -> None:
        """If no router knows the request, a router died holding it (or its Generate was lost)."""
        request_id = state.open.request_id
        status = await self._route_status(request_id)
        if status is None or status.queued:
            # Nothing learned, or it waits in a live router's queue: ask again at the next
            # sweep (a router that dies holding it stops saying so, and then it moves).
            state.route_checked = False
            return
        if status.worker_id is not None:
            if not state.worker_id:  # known now: a stall check can ask it (decision 018)
                state.worker_id = status.worker_id
                state.lost_workers.discard(status.worker_id)
            return
        if self._streams.get(request_id) is state and state.next_index == state.index_base:
            with bound_contextvars(request_id=request_id):
                await self._move(state, "", "lost_before_routing")

    # --- stall checks (WorkerPing) -------------------------------------------------------------

    async def on_bus_back(self) -> None:
        """Our connection is back: batches may have been lost meanwhile; ask every worker now."""
        now = self._reconnected_at = self._clock()
        for _, state in self._streams.open_requests():
            if state.ping_started(now):
                self.ping(state)

    def ping(self, state: RequestFormatter) -> None:
        """Ask the request's worker, in a task, whether it holds this attempt (``ping_started``
        said yes); if it does not, migrate the request."""
        args = (state, state.worker_id, state.migrations, self._clock())
        self._tasks.spawn(self._ping(*args), name=f"ping-{state.open.request_id}")

    async def _ping(
        self, state: RequestFormatter, worker_id: str, attempt: int, asked_at: float
    ) -> None:
        request_id = state.open.request_id
        with bound_contextvars(request_id=request_id):
            try:
                if state.next_index == state.index_base:
                    worker_id = await self._current_worker(state, worker_id)
                is_held = await self._ask(request_id, worker_id, attempt)
            finally:
                state.is_pinging = False
            if is_held is not False or not self._unchanged(state, worker_id, attempt, asked_at):
                return
            log.info("request_not_on_worker", worker_id=worker_id, attempt=attempt)
            try:
                outcome = await self._migrate(state, worker_id, "not_on_worker")
            except Exception:  # a task's boundary: log once, the idle timeout remains
                log.exception("request_crashed", kind="not_on_worker")
                return
            if outcome is not None:  # it may just be slow: the idle timeout decides
                log.warning("request_not_migrated", worker_id=worker_id, why=outcome.reason)

    async def _route_status(self, request_id: str) -> RouteStatus | None:
        """Ask the routers which worker has the request; None when nothing was learned."""
        query = codec.encode(RouteQuery(request_id=request_id))
        try:
            reply = await self._nc.request(
                self._subjects.route_status, query, timeout=ROUTE_QUERY_TIMEOUT_S
            )
            return codec.decode(reply.data, RouteStatus)
        except (nats.errors.Error, codec.DecodeError) as exc:
            log.debug("route_check_failed", request_id=request_id, error=str(exc))
            return None

    async def _current_worker(self, state: RequestFormatter, worker_id: str) -> str:
        """Before a first token, the worker that holds the request can change: a disaggregated
        request moves from its prefill worker to its decode worker (decision 024), so the
        routers are asked again which one has it now (``worker_id`` if none answers)."""
        status = await self._route_status(state.open.request_id)
        if status is None:
            return worker_id
        current = status.worker_id
        if current is None or current == worker_id or state.worker_id != worker_id:
            return worker_id
        state.worker_id = current
        state.lost_workers.discard(current)
        return current

    async def _ask(self, request_id: str, worker_id: str, attempt: int) -> bool | None:
        """Whether the worker holds that attempt; ``None`` when nothing was learned."""
        ping = codec.encode(WorkerPing(request_id=request_id, attempt=attempt))
        subject = self._subjects.worker_ping(worker_id)
        try:
            reply = await self._nc.request(subject, ping, timeout=PING_TIMEOUT_S)
        except nats.errors.NoRespondersError:
            return None if self._clock() - self._reconnected_at < RECONNECT_GRACE_S else False
        except (nats.errors.Error, TimeoutError) as exc:  # silence or no bus: routers judge it
            log.debug("worker_ping_unanswered", worker_id=worker_id, error=type(exc).__name__)
            return None
        try:
            return WORKER_PONG.decode(reply.data).held
        except codec.DecodeError:  # a worker from before decision 018 answers an empty body
            return None

    def _unchanged(
        self, state: RequestFormatter, worker_id: str, attempt: int, asked_at: float
    ) -> bool:
        """Whether the answer still applies: same request, attempt and worker, no batch since."""
        return (
            self._streams.get(state.open.request_id) is state
            and state.migrations == attempt
            and state.worker_id == worker_id
            and state.last_seen <= asked_at
        )


def _numbers(history: ChunkHistory) -> tuple[int, int]:
    return history.first_seq, history.next_seq
