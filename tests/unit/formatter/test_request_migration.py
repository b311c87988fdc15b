"""A request's formatting state across a migration: positions, stale attempts, routing checks."""

from __future__ import annotations

from typing import Any

from services.formatter.request import RequestFormatter
from shared.messages import Generate, TokenBatch
from tests.unit.migration_support import GEN, migratable_open


def _state(tokenizer: Any, generate: Generate | None = GEN) -> RequestFormatter:
    open_ = migratable_open(generate, stream=True)
    return RequestFormatter(open_, tokenizer, now=0.0)


def test_the_next_attempt_counts_its_batches_after_what_came_before(tokenizer: Any) -> None:
    state = _state(tokenizer)
    state.on_batch(TokenBatch(request_id="r", token_ids=(9707, 1879), worker_id="w1"), now=1)
    state.migrated("w1", now=2)
    batch = TokenBatch(request_id="r", token_ids=(11,), index=0, worker_id="w2", attempt=1)
    assert state.position(batch) == 2
    state.on_batch(batch, now=3)
    assert (state.next_index, state.generated, state.lost_workers) == (3, [9707, 1879, 11], {"w1"})


def test_a_routing_check_is_due_once_per_attempt_without_a_token(tokenizer: Any) -> None:
    state = _state(tokenizer)
    assert not state.awaits_routing_check(now=1.0, after_s=2.0)
    assert state.awaits_routing_check(now=2.5, after_s=2.0)
    assert not state.awaits_routing_check(now=9.0, after_s=2.0)
    state.migrated("", now=10.0)
    assert state.awaits_routing_check(now=12.5, after_s=2.0)


def test_no_routing_check_once_tokens_flow_or_without_migration(tokenizer: Any) -> None:
    state = _state(tokenizer)
    state.on_batch(TokenBatch(request_id="r", token_ids=(9707,)), now=0.1)
    assert not state.awaits_routing_check(now=5.0, after_s=2.0)
    assert not _state(tokenizer, None).awaits_routing_check(now=5.0, after_s=2.0)
