"""Attempts: what the formatter does with each event of a request that may migrate (every rule)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.formatter.attempts import (
    Answer,
    Attempts,
    FailLost,
    Forward,
    Gap,
    Migrate,
    Repeated,
    Resume,
    Stale,
)
from services.formatter.migration import NotMigrated
from services.formatter.request import RequestFormatter
from shared.messages import Generate, RequestFailed, RouteChoice, TokenBatch, WorkerLost
from tests.unit.migration_support import GEN, migratable_open

HELLO = (9707, 1879)
"""Two token ids of the Qwen3 tokenizer (``Hello world``)."""
NOW = 5.0
RULES = Attempts(lambda request_id: f"fmt.{request_id}")


def request(tokenizer: Any, generate: Generate | None = GEN) -> RequestFormatter:
    """Request ``r``, streaming (a cancelled end is a chunk, not a failure), limit 3."""
    return RequestFormatter(migratable_open(generate, stream=True), tokenizer, now=0.0)


def batch(ids: tuple[int, ...], index: int = 0, **fields: Any) -> TokenBatch:
    """A batch of request ``r`` from worker ``w1`` (unless ``worker_id`` says otherwise)."""
    fields.setdefault("worker_id", "w1")
    return TokenBatch(request_id="r", token_ids=ids, index=index, **fields)


def started(tokenizer: Any, generate: Generate | None = GEN) -> RequestFormatter:
    """A request whose worker ``w1`` sent ``HELLO`` (positions 0 and 1)."""
    state = request(tokenizer, generate)
    state.on_batch(batch(HELLO), now=1.0)
    return state


def next_attempt_of(generated: tuple[int, ...], attempt: int = 1) -> Generate:
    """``GEN`` as routed again after ``generated``: the tokens appended, the budget reduced."""
    sampling = msgspec.structs.replace(GEN.sampling, max_tokens=50 - len(generated))
    return msgspec.structs.replace(
        GEN,
        token_ids=(*GEN.token_ids, *generated),
        sampling=sampling,
        resumed_tokens=len(generated),
        stream_to="fmt.r",
        attempt=attempt,
    )


def attempt_state(state: RequestFormatter) -> tuple[int, int, str, set[str]]:
    """What a migration changes: ``(migrations, index_base, worker_id, lost_workers)``."""
    return state.migrations, state.index_base, state.worker_id, state.lost_workers


class TestBatches:
    def test_the_next_batch_of_the_current_attempt_is_formatted_as_it_is(
        self, tokenizer: Any
    ) -> None:
        state = started(tokenizer)
        nxt = batch((11,), index=2)
        assert RULES.on_event(state, nxt, NOW) is nxt

    def test_the_next_batch_after_a_migration_counts_from_zero(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        state.migrated("w1", now=2.0)
        nxt = batch((11,), index=0, attempt=1)
        assert RULES.on_event(state, nxt, NOW) is nxt

    def test_a_batch_of_an_earlier_attempt_is_stale(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        state.migrated("w1", now=2.0)
        assert RULES.on_event(state, batch((11,), index=2), NOW) == Stale("old_attempt")

    def test_a_batch_that_starts_before_the_next_token_is_a_repeat(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        assert RULES.on_event(state, batch(HELLO), NOW) == Repeated(expected=2, got=0)

    def test_a_gap_migrates_from_the_tokens_received(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        decided = RULES.on_event(state, batch((11,), index=7), NOW)
        moved = Migrate(next_attempt_of(HELLO), "w1", "batch_gap", "ongoing")
        assert decided == Gap(expected=2, got=7, then=moved)
        assert attempt_state(state) == (1, 2, "", {"w1"})
        assert state.last_seen == NOW

    def test_a_gap_before_any_worker_is_known_moves_from_the_batch_s_worker(
        self, tokenizer: Any
    ) -> None:
        state = request(tokenizer)
        decided = RULES.on_event(state, batch((11,), index=3, worker_id="w2"), NOW)
        moved = Migrate(next_attempt_of(()), "w2", "batch_gap", "new_request")
        assert decided == Gap(expected=0, got=3, then=moved)

    def test_a_gap_in_a_request_that_may_not_move_fails_it(self, tokenizer: Any) -> None:
        state = started(tokenizer, generate=None)
        lost = FailLost(
            "w1", "migration is off", "token batches were lost in transit; migration is off"
        )
        assert RULES.on_event(state, batch((11,), index=7), NOW) == Gap(2, 7, lost)
        assert attempt_state(state) == (0, 0, "w1", set())

    def test_a_gap_past_the_migration_limit_fails_it(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        for _ in range(3):
            state.migrated("w1", now=2.0)
        why = "the migration limit (3) is reached"
        decided = RULES.on_event(state, batch((11,), index=5, attempt=3), NOW)  # from 2 + 5
        lost = FailLost("w1", why, f"token batches were lost in transit; {why}")
        assert decided == Gap(expected=2, got=7, then=lost)
        assert state.migrations == 3


class TestWorkerCancelled:
    """A worker that gives a request up (a drain that ran out of time) ends it ``cancelled``."""

    def test_its_tokens_are_kept_then_it_resumes(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        gave_up = batch((11, 12), index=2, finish_reason="cancelled")
        kept = batch((11, 12), index=2)
        assert RULES.on_event(state, gave_up, NOW) == Resume(gave_up, kept)

    def test_with_no_tokens_nothing_is_kept(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        gave_up = batch((), index=2, finish_reason="cancelled")
        assert RULES.on_event(state, gave_up, NOW) == Resume(gave_up, None)

    def test_a_request_that_may_never_move_is_formatted_as_it_is(self, tokenizer: Any) -> None:
        state = started(tokenizer, generate=None)
        gave_up = batch((11,), index=2, finish_reason="cancelled")
        assert RULES.on_event(state, gave_up, NOW) is gave_up

    def test_after_its_tokens_it_migrates_from_the_worker(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        gave_up = batch((11,), index=2, finish_reason="cancelled")
        state.on_batch(batch((11,), index=2), now=3.0)  # the kept tokens
        decided = RULES.after_resume(state, gave_up, NOW)
        assert decided == Migrate(
            next_attempt_of((*HELLO, 11)), "w1", "worker_cancelled", "ongoing"
        )
        assert attempt_state(state) == (1, 3, "", {"w1"})

    def test_tokens_that_showed_a_gap_moved_it_already(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        gave_up = batch((11,), index=9, finish_reason="cancelled")
        RULES.on_event(state, batch((11,), index=9), NOW)  # the kept tokens: a gap
        assert RULES.after_resume(state, gave_up, NOW) == Stale("moved_already")
        assert state.migrations == 1

    def test_one_that_may_not_move_ends_cancelled_after_its_tokens(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        for _ in range(3):
            state.migrated("w1", now=2.0)
        gave_up = batch((11,), index=0, finish_reason="cancelled", attempt=3)
        state.on_batch(batch((11,), index=0, attempt=3), now=3.0)  # the kept tokens
        decided = RULES.after_resume(state, gave_up, NOW)
        assert decided == batch((), index=1, finish_reason="cancelled", attempt=3)
        assert state.migrations == 3

    def test_its_emptied_batch_ends_the_request_cancelled(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        for _ in range(3):
            state.migrated("w1", now=2.0)
        gave_up = batch((), index=0, finish_reason="cancelled", attempt=3)
        end = RULES.after_resume(state, gave_up, NOW)
        assert isinstance(end, TokenBatch)
        state.on_batch(end, now=NOW)
        assert (state.finish_reason, state.completion_tokens) == ("cancelled", 2)


class TestFailures:
    @pytest.mark.parametrize("code", ["worker_busy", "shutting_down"])
    def test_a_worker_that_may_not_take_it_is_replaced(self, tokenizer: Any, code: str) -> None:
        state = request(tokenizer)
        failed = RequestFailed(request_id="r", code=code, message="not now")
        decided = RULES.on_event(state, failed, NOW)
        assert decided == Migrate(next_attempt_of(()), "", code, "new_request")
        assert state.migrations == 1

    def test_any_other_failure_is_forwarded(self, tokenizer: Any) -> None:
        state = request(tokenizer)
        failed = RequestFailed(request_id="r", code="internal_error", message="boom")
        assert RULES.on_event(state, failed, NOW) == Forward(failed)
        assert state.migrations == 0

    def test_a_retryable_failure_of_one_that_may_not_move_is_forwarded(
        self, tokenizer: Any
    ) -> None:
        state = request(tokenizer, generate=None)
        failed = RequestFailed(request_id="r", code="worker_busy", message="full")
        assert RULES.on_event(state, failed, NOW) == Forward(failed)

    def test_a_retryable_failure_past_the_limit_is_forwarded(self, tokenizer: Any) -> None:
        state = request(tokenizer)
        for _ in range(3):
            state.migrated("", now=2.0)
        failed = RequestFailed(request_id="r", code="worker_busy", message="full")
        assert RULES.on_event(state, failed, NOW) == Forward(failed)
        assert state.migrations == 3


def test_a_query_only_answer_is_the_batches_that_end_each_choice(tokenizer: Any) -> None:
    state = request(tokenizer)
    choice = RouteChoice(request_id="r", worker_id="w3", token_ids=(1, 2), prompt_tokens=2)
    end = TokenBatch(
        request_id="r", token_ids=(), finish_reason="stop", prompt_tokens=2, worker_id="w3"
    )
    assert RULES.on_event(state, choice, NOW) == Answer((end,))
    assert state.query == choice


class TestWorkerLost:
    def test_its_worker_s_request_migrates(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        lost = WorkerLost(worker_id="w1", request_ids=("r",), reason="no_responders")
        decided = RULES.on_worker_lost(state, lost, NOW)
        assert decided == Migrate(
            next_attempt_of(HELLO), "w1", "worker_lost:no_responders", "ongoing"
        )
        assert attempt_state(state) == (1, 2, "", {"w1"})

    def test_a_request_whose_worker_is_not_known_yet_migrates(self, tokenizer: Any) -> None:
        state = request(tokenizer)
        lost = WorkerLost(worker_id="w1", request_ids=("r",), reason="unresponsive")
        decided = RULES.on_worker_lost(state, lost, NOW)
        assert decided == Migrate(
            next_attempt_of(()), "w1", "worker_lost:unresponsive", "new_request"
        )

    def test_a_worker_it_left_already_is_old_news(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        state.migrated("w1", now=2.0)
        lost = WorkerLost(worker_id="w1", request_ids=("r",))
        assert RULES.on_worker_lost(state, lost, NOW) == Stale("worker_left_already")
        assert state.migrations == 1

    def test_another_worker_s_loss_is_not_its_concern(self, tokenizer: Any) -> None:
        state = started(tokenizer)
        lost = WorkerLost(worker_id="w2", request_ids=("r",))
        assert RULES.on_worker_lost(state, lost, NOW) == Stale("another_worker")
        assert state.migrations == 0

    def test_one_that_may_not_move_fails_worker_lost(self, tokenizer: Any) -> None:
        state = started(tokenizer, generate=None)
        lost = WorkerLost(worker_id="w1", request_ids=("r",))
        message = "the worker serving this request was lost; migration is off"
        assert RULES.on_worker_lost(state, lost, NOW) == FailLost("w1", "migration is off", message)


class TestMigrate:
    def test_a_request_that_may_not_move_is_left_as_it_is(self, tokenizer: Any) -> None:
        state = started(tokenizer, generate=None)
        moved = RULES.migrate(state, "w1", "not_on_worker", NOW)
        assert moved == NotMigrated("migration is off")
        assert attempt_state(state) == (0, 0, "w1", set())

    def test_a_move_with_no_worker_cancels_none(self, tokenizer: Any) -> None:
        state = request(tokenizer)
        moved = RULES.move(state, "", "lost_before_routing", NOW)
        assert moved == Migrate(next_attempt_of(()), "", "lost_before_routing", "new_request")
        assert attempt_state(state) == (1, 0, "", set())

    def test_the_next_attempt_streams_to_this_formatter(self, tokenizer: Any) -> None:
        rules = Attempts(lambda request_id: f"ns.v1.stream.f9.{request_id}")
        moved = rules.migrate(request(tokenizer), "w1", "not_on_worker", NOW)
        assert isinstance(moved, Migrate)
        assert moved.attempt.stream_to == "ns.v1.stream.f9.r"
