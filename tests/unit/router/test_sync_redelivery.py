"""A KV-event consumer re-created after a nats-server restart may deliver sequences again."""

from __future__ import annotations

from services.router.sync import KvSync, Outcome
from shared.messages import BlockStored, KvEventBatch


def _batch(event_id: int, *hashes: int) -> KvEventBatch:
    return KvEventBatch(
        worker_id="a", event_id=event_id, events=(BlockStored(block_hashes=hashes),)
    )


def test_a_sequence_already_consumed_is_a_duplicate() -> None:
    sync = KvSync()
    sync.on_batch(_batch(1, 11), 5)
    assert sync.on_batch(_batch(2, 12), 5) is Outcome.DUPLICATE
    assert (sync.stream_seq, sync.last_event_id) == (5, {"a": 1})


def test_a_replayed_first_batch_does_not_look_like_a_restarted_worker() -> None:
    sync = KvSync()
    sync.on_batch(_batch(1, 11), 1)
    sync.on_batch(_batch(2, 12), 2)
    assert sync.on_batch(_batch(1, 11), 1) is Outcome.DUPLICATE
    assert sync.index.blocks_of("a") == frozenset({11, 12})


def test_batches_without_a_sequence_are_judged_by_event_id_alone() -> None:
    sync = KvSync(stream_seq=9)
    assert sync.on_batch(_batch(1, 11)) is Outcome.APPLIED
