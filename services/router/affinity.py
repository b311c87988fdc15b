"""Session affinity wiring: ``sessions.py``'s decisions on this replica's view, and their writes.

``plan`` runs on the hot path (memory only): the session's binding from the watched table, the
bound target's liveness and busy state from the routing core. ``routed`` runs after the
decision: it counts the outcome and writes the binding in a task of its own (create, move or
refresh, compare-and-set in ``SessionStore``), so a turn never waits on the bucket. When a
session's turn moves away from the worker its previous turn ran on, a speculative prefill
started there (``RoutingHints.speculative_prefill``, ``shared.worker.speculative``) is
cancelled: nobody will use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import nats.errors
import structlog
from nats.aio.client import Client
from nats.js.errors import KeyWrongLastSequenceError

from services.router.core import RoutingCore
from services.router.fleet import rank_cards
from services.router.metrics import RouterMetrics
from services.router.session_store import SessionStore
from services.router.sessions import AffinityMode, Binding, Plan, plan, refresh_after_s, settle
from shared import codec
from shared.messages import Cancel, Generate, RouteDecision, WorkerCard
from shared.sessions import session_key, speculative_request_id
from shared.subjects import Subjects
from shared.targets import target_id, worker_of
from shared.tasks import TaskSet

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Turn:
    """One session turn being routed: its key, the binding it found and the plan."""

    key: str
    session_id: str
    binding: Binding | None
    plan: Plan
    speculative: bool


class SessionAffinity:
    """Session affinity on one router replica (on when ``--session-affinity-ttl-s`` > 0)."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        store: SessionStore,
        core: RoutingCore,
        metrics: RouterMetrics,
        *,
        mode: AffinityMode,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self.store = store
        self._core = core
        self._metrics = metrics
        self.mode: AffinityMode = mode
        self._refresh_after_s = refresh_after_s(store.table.ttl_s)
        self._tasks = TaskSet()

    async def start(self) -> None:
        await self.store.start()

    async def stop(self) -> None:
        await self._tasks.close()
        await self.store.stop()

    def plan(self, gen: Generate, live: Sequence[WorkerCard], now: float) -> Turn | None:
        """How ``gen`` is routed as a session turn (None: it names no session)."""
        hints = gen.routing
        if hints is None or hints.session_id is None or hints.query_only:
            return None
        key = session_key(gen.model, hints.session_id)
        binding = self.store.binding(key)
        card = None if binding is None else _target_card(live, binding)
        is_busy = card is not None and self.mode == "soft" and self._core.is_busy(card, now)
        turn = plan(binding, self.mode, is_live=card is not None, is_busy=is_busy)
        return Turn(key, hints.session_id, binding, turn, hints.speculative_prefill)

    def routed(self, gen: Generate, turn: Turn, decision: RouteDecision, now: float) -> None:
        """Count the turn and write its binding (in a task: nothing here waits)."""
        chosen = target_id(decision.worker_id, decision.dp_rank)
        write = settle(turn.plan, turn.binding, chosen, now, self._refresh_after_s)
        if turn.plan.verdict == "hit" and write != "move":
            self._metrics.session_bindings.labels("hit").inc()
        if write == "none":
            return
        self._tasks.spawn(self._write(gen, turn, decision, write), name="session-write")

    async def _write(self, gen: Generate, turn: Turn, decision: RouteDecision, write: str) -> None:
        """A task's boundary: a failure is logged once; the turn was routed anyway."""
        try:
            await self._store(gen, turn, decision, write)
        except Exception:  # a task's boundary: log once
            log.exception("session_write_failed", request_id=gen.request_id, write=write)

    async def _store(self, gen: Generate, turn: Turn, decision: RouteDecision, write: str) -> None:
        worker_id, dp_rank = decision.worker_id, decision.dp_rank
        store, old = self.store, turn.binding
        if write == "move" and old is not None and turn.speculative:
            await self._cancel_speculative(gen, turn, old)  # first: it frees a slot there
        try:
            if old is None:
                binding, ours = await store.create(turn.key, worker_id, dp_rank)
                event = "created" if ours else "adopted"
            else:
                binding, ours = await store.replace(turn.key, old, worker_id, dp_rank)
                event = ("moved" if write == "move" else "refreshed") if ours else "adopted"
        except (nats.errors.Error, KeyWrongLastSequenceError, TimeoutError) as exc:
            log.warning("session_binding_not_written", write=write, error=repr(exc))
            return
        self._metrics.session_bindings.labels(event).inc()
        if event != "refreshed":
            log.info(
                "session_bound",
                request_id=gen.request_id,
                how=event,
                worker_id=binding.worker_id,
                dp_rank=binding.dp_rank,
                was=None if old is None else old.target,
                verdict=turn.plan.verdict,
            )

    async def _cancel_speculative(self, gen: Generate, turn: Turn, old: Binding) -> None:
        """The previous turn's worker may be warming this session's next turn: stop it."""
        request_id = speculative_request_id(gen.request_id, gen.model, turn.session_id)
        cancel = Cancel(request_id=request_id, reason="session_moved", worker_id=old.worker_id)
        try:
            await self._nc.publish(self._subjects.cancel, codec.encode(cancel))
        except nats.errors.Error as exc:
            log.debug("speculative_cancel_not_sent", error=repr(exc))


def _target_card(live: Sequence[WorkerCard], binding: Binding) -> WorkerCard | None:
    """The bound target's card among the ``live`` workers (None: it is not live)."""
    for card in live:
        if worker_of(card.worker_id) != binding.worker_id:
            continue
        if binding.dp_rank >= max(card.dp_size, 1):
            return None
        return card if card.dp_size <= 1 else rank_cards(card)[binding.dp_rank]
    return None
