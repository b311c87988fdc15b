"""What to do with each event of a request that may run as several attempts (decisions 017,
018). Pure: no I/O and no clock (``now`` is passed in); the service publishes what it is told.

A request runs on one worker at a time; each migration starts attempt ``migrations + 1`` on
another, which counts its batches from 0 again (``RequestFormatter.index_base``). Per event:

- a ``TokenBatch`` of the current attempt that starts at the next token → the batch itself:
  format it (the per-token path, nothing allocated);
- a batch of an earlier attempt → ``Stale``; one that starts before the next token → ``Repeated``;
  one that starts past it (batches were lost) → ``Gap``, then ``Migrate`` from the tokens the
  request has, or ``FailLost`` (``worker_lost``) when it may not move;
- a batch the worker ended ``cancelled`` (it gave the request up while draining) → ``Resume``:
  its tokens are delivered, then ``after_resume`` says ``Migrate``, or, when the request may not
  move, the batch emptied of its tokens: the request ends ``cancelled``;
- a ``RequestFailed`` with a retryable code (``migration.RETRYABLE_CODES``) → ``Migrate``;
  any other failure, or one of a request that may not move → ``Forward`` it as it came;
- a router's ``RouteChoice`` (a query-only request) → ``Answer``: the batches that end it;
- a router's ``WorkerLost`` → ``Migrate`` or ``FailLost``; ``Stale`` when the request already
  left that worker, or its batches come from another one.

Whether a request may move, and the ``Generate`` of its next attempt, come from
``migration.next_attempt``. The rules apply the request's own bookkeeping (``migrated``,
``answer_query``) as they decide, so no await can come between a decision and its state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec

from services.formatter.migration import RETRYABLE_CODES, NotMigrated, next_attempt
from shared.messages import (
    Generate,
    MigrationKind,
    RequestFailed,
    RouteChoice,
    StreamOpen,
    TokenBatch,
    WorkerEvent,
    WorkerLost,
)

WORKER_LOST = "the worker serving this request was lost"
"""``FailLost.message`` (before the reason it may not move) when its worker is gone."""
BATCHES_LOST = "token batches were lost in transit"
"""``FailLost.message`` (before the reason it may not move) after a ``Gap``."""


class Progress(Protocol):
    """What the rules read and move of one request's state (``request.RequestFormatter``)."""

    @property
    def open(self) -> StreamOpen: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def migrations(self) -> int: ...
    @property
    def lost_workers(self) -> Set[str]: ...
    @property
    def generated(self) -> Sequence[int] | None: ...
    @property
    def next_index(self) -> int: ...
    def position(self, batch: TokenBatch) -> int: ...
    def expected_index(self, batch: TokenBatch) -> int: ...
    def migrated(self, from_worker: str, now: float) -> None: ...
    def answer_query(self, choice: RouteChoice) -> tuple[TokenBatch, ...]: ...


@dataclass(frozen=True, slots=True)
class Stale:
    """Nothing to do: the event is about an attempt or a worker the request has left."""

    reason: Literal["old_attempt", "moved_already", "worker_left_already", "another_worker"]


@dataclass(frozen=True, slots=True)
class Repeated:
    """The batch starts at ``got``, before the next token (``expected``): already delivered."""

    expected: int
    got: int


@dataclass(frozen=True, slots=True)
class Migrate:
    """The request moved to attempt ``attempt.attempt`` (its state says so already): cancel
    ``from_worker``'s attempt (if any), route ``attempt``, tell who watches migrations."""

    attempt: Generate
    from_worker: str
    reason: str
    kind: MigrationKind


@dataclass(frozen=True, slots=True)
class FailLost:
    """The request had to move and may not: fail it with ``worker_lost`` and ``message``."""

    from_worker: str
    why: str
    """``NotMigrated.reason``."""
    message: str


@dataclass(frozen=True, slots=True)
class Gap:
    """Batches were lost between ``expected`` and ``got`` (the batch is dropped): ``then``."""

    expected: int
    got: int
    then: Migrate | FailLost


@dataclass(frozen=True, slots=True)
class Forward:
    """End the request with its failure as it came (it is not retryable, or may not move)."""

    failed: RequestFailed


@dataclass(frozen=True, slots=True)
class Resume:
    """The worker gave the attempt up: deliver ``kept`` (its tokens, if any, not finished),
    then do what ``after_resume(batch)`` says."""

    batch: TokenBatch
    kept: TokenBatch | None


@dataclass(frozen=True, slots=True)
class Answer:
    """A query-only request's answer: deliver ``batches`` (one per choice, each ends it)."""

    batches: tuple[TokenBatch, ...]


Outcome = Stale | Repeated | Migrate | FailLost | Gap | Forward | Resume | Answer
"""What to do instead of formatting an event."""

_OLD_ATTEMPT = Stale("old_attempt")
_MOVED_ALREADY = Stale("moved_already")
_WORKER_LEFT_ALREADY = Stale("worker_left_already")
_ANOTHER_WORKER = Stale("another_worker")


class Attempts:
    """The per-event rules of one formatter's requests.

    ``stream_to(request_id)`` is where a request's next attempt streams its batches: this
    formatter's subject for it.
    """

    __slots__ = ("_stream_to",)

    def __init__(self, stream_to: Callable[[str], str]) -> None:
        self._stream_to = stream_to

    def on_event(self, state: Progress, event: WorkerEvent, now: float) -> TokenBatch | Outcome:
        """The batch to format (the next one of the current attempt), or what to do instead."""
        if isinstance(event, TokenBatch):
            if event.attempt != state.migrations:
                return _OLD_ATTEMPT
            if event.finish_reason == "cancelled" and state.open.generate is not None:
                return _resume(event)
            position = state.position(event)
            expected = state.expected_index(event)
            if position == expected:
                return event
            if position < expected:
                return Repeated(expected, position)
            from_worker = state.worker_id or event.worker_id
            moved = self.move(state, from_worker, "batch_gap", now, lost=BATCHES_LOST)
            return Gap(expected, position, moved)
        if isinstance(event, RouteChoice):
            return Answer(state.answer_query(event))
        return self._on_failure(state, event, now)

    def _on_failure(self, state: Progress, failed: RequestFailed, now: float) -> Outcome:
        """A worker that may not take the request (yet) is retried elsewhere when it may move."""
        if failed.code in RETRYABLE_CODES and state.open.generate is not None:
            moved = self.migrate(state, state.worker_id, failed.code, now)
            if isinstance(moved, Migrate):
                return moved
        return Forward(failed)

    def after_resume(self, state: Progress, batch: TokenBatch, now: float) -> TokenBatch | Outcome:
        """After a ``Resume``'s tokens were kept: migrate from its worker, or, when the request
        may not move, the batch emptied of its tokens, to format as is (it ends ``cancelled``)."""
        if state.migrations != batch.attempt:
            return _MOVED_ALREADY  # the kept tokens showed a gap: it moved with them
        moved = self.migrate(state, batch.worker_id, "worker_cancelled", now)
        if isinstance(moved, Migrate):
            return moved
        index = batch.index + len(batch.token_ids)
        return msgspec.structs.replace(batch, token_ids=(), index=index)

    def on_worker_lost(self, state: Progress, lost: WorkerLost, now: float) -> Outcome:
        """A router found ``lost.worker_id`` lost: move the request if that worker holds it."""
        if lost.worker_id in state.lost_workers:
            return _WORKER_LEFT_ALREADY  # old news: its late batches are told apart by attempt
        if state.worker_id not in ("", lost.worker_id):
            return _ANOTHER_WORKER
        return self.move(state, lost.worker_id, f"worker_lost:{lost.reason}", now)

    def move(
        self, state: Progress, from_worker: str, reason: str, now: float, *, lost: str = WORKER_LOST
    ) -> Migrate | FailLost:
        """Migrate the request, or fail it (``lost``, then why) when it may not move."""
        moved = self.migrate(state, from_worker, reason, now)
        if isinstance(moved, NotMigrated):
            return FailLost(from_worker, moved.reason, f"{lost}; {moved.reason}")
        return moved

    def migrate(
        self, state: Progress, from_worker: str, reason: str, now: float
    ) -> Migrate | NotMigrated:
        """Start the request's next attempt from where it stopped, or say why it may not."""
        request_id = state.open.request_id
        generated = state.generated or ()
        attempt = next_attempt(state.open, generated, state.migrations, self._stream_to(request_id))
        if isinstance(attempt, NotMigrated):
            return attempt
        kind: MigrationKind = "ongoing" if state.next_index else "new_request"
        state.migrated(from_worker, now)
        return Migrate(attempt, from_worker, reason, kind)


def _resume(batch: TokenBatch) -> Resume:
    kept = msgspec.structs.replace(batch, finish_reason=None) if batch.token_ids else None
    return Resume(batch, kept)
