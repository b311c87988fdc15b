"""KV index semantics: stored (even under an unknown parent), removed, cleared, worker removed."""

from __future__ import annotations

from services.router.indexer import RadixIndex, decode_snapshot, encode_snapshot
from services.router.sync import KvSync, Outcome
from shared.hashing import prefix_hashes
from shared.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvDump, KvEventBatch

PROMPT = list(range(1000, 1000 + 16 * 6))
H = prefix_hashes(PROMPT, 16)  # six chained sequence hashes


def _stored(hashes: list[int], parent: int | None = None) -> BlockStored:
    return BlockStored(block_hashes=tuple(hashes), parent_hash=parent)


class TestRadixIndex:
    def test_overlap_counts_leading_blocks_per_worker(self) -> None:
        index = RadixIndex()
        index.store("a", H[:4])
        index.store("b", H[:2])
        assert index.find_matches(H) == {"a": 4, "b": 2}

    def test_unknown_worker_and_empty_prompt_score_nothing(self) -> None:
        index = RadixIndex()
        index.store("a", H[:2])
        assert index.find_matches([]) == {}
        assert index.find_matches(prefix_hashes(list(range(32)), 16)) == {}

    def test_block_under_unknown_parent_is_stored_but_matches_only_once_the_chain_is_whole(
        self,
    ) -> None:
        index = RadixIndex()
        index.apply("a", _stored(H[2:4], parent=H[1]))
        assert index.worker_blocks("a") == 2
        assert index.find_matches(H) == {}
        index.apply("a", _stored(H[:2]))
        assert index.find_matches(H) == {"a": 4}

    def test_removed_block_cuts_the_match_there(self) -> None:
        index = RadixIndex()
        index.apply("a", _stored(H))
        index.apply("a", BlockRemoved(block_hashes=(H[3],)))
        assert index.find_matches(H) == {"a": 3}
        assert index.worker_blocks("a") == 5

    def test_removing_unknown_blocks_is_harmless(self) -> None:
        index = RadixIndex()
        index.apply("a", _stored(H[:2]))
        index.apply("a", BlockRemoved(block_hashes=(123, H[5])))
        index.apply("zz", BlockRemoved(block_hashes=(H[0],)))
        assert index.find_matches(H) == {"a": 2}

    def test_cleared_worker_keeps_nothing_but_others_keep_theirs(self) -> None:
        index = RadixIndex()
        index.store("a", H)
        index.store("b", H[:3])
        index.apply("a", AllBlocksCleared())
        assert index.find_matches(H) == {"b": 3}
        assert "a" in index.workers()

    def test_removed_worker_is_forgotten_and_shared_nodes_survive(self) -> None:
        index = RadixIndex()
        index.store("a", H)
        index.store("b", H[:3])
        assert index.remove_worker("a")
        assert index.workers() == ["b"]
        assert index.num_nodes == 3
        assert index.find_matches(H) == {"b": 3}

    def test_a_departed_worker_s_slot_is_reused_without_its_blocks(self) -> None:
        index = RadixIndex()
        index.store("a", H)
        index.store("b", H[:2])
        fleet = ("a", "b")
        assert index.ids(index.bits_cached(fleet, fleet)) == ["a", "b"]
        index.remove_worker("a")
        index.store("c", H[:1])  # takes a's slot
        assert index.find_matches(H) == {"b": 2, "c": 1}
        assert index.match_groups(H) == [(1, index.bits(["c"])), (2, index.bits(["b"]))]
        assert sorted(index.ids(index.bits_cached(fleet, fleet))) == ["b"]  # a is gone

    def test_nodes_without_workers_are_dropped(self) -> None:
        index = RadixIndex()
        index.store("a", H)
        index.remove("a", H)
        assert (index.num_nodes, index.num_entries) == (0, 0)

    def test_snapshot_round_trips_through_msgpack(self) -> None:
        index = RadixIndex()
        index.store("a", H)
        index.store("b", H[:2])
        snap = index.snapshot(stream_seq=42, last_event_ids={"a": 7, "b": 3})
        restored, last = RadixIndex.restore(decode_snapshot(encode_snapshot(snap)))
        assert restored.state() == index.state()
        assert last == {"a": 7, "b": 3}


def _batch(worker: str, event_id: int, *events: object) -> KvEventBatch:
    return KvEventBatch(worker_id=worker, event_id=event_id, events=tuple(events))  # type: ignore[arg-type]


class TestKvSync:
    def test_in_order_batches_apply_and_replays_are_skipped(self) -> None:
        sync = KvSync()
        assert sync.on_batch(_batch("a", 1, _stored(H[:2])), 1) is Outcome.APPLIED
        assert sync.on_batch(_batch("a", 2, _stored(H[2:4], H[1])), 2) is Outcome.APPLIED
        assert sync.on_batch(_batch("a", 2, _stored(H[4:], H[3])), 3) is Outcome.DUPLICATE
        assert sync.index.find_matches(H) == {"a": 4}
        assert sync.stream_seq == 3

    def test_gap_holds_batches_until_the_dump_replaces_the_worker(self) -> None:
        sync = KvSync()
        sync.on_batch(_batch("a", 1, _stored([999])))
        assert sync.on_batch(_batch("a", 3, _stored(H[3:4], H[2]))) is Outcome.GAP
        assert sync.on_batch(_batch("a", 4, _stored(H[4:5], H[3]))) is Outcome.HELD
        assert not sync.is_settled
        dump = KvDump(worker_id="a", event_id=3, events=(_stored(H[:4]),))
        assert list(sync.apply_dump(dump)) == [Outcome.DUPLICATE, Outcome.APPLIED]
        assert sync.index.find_matches(H) == {"a": 5}
        assert sync.index.blocks_of("a") == frozenset(H[:5])
        assert sync.last_event_id["a"] == 4
        assert sync.is_settled

    def test_first_batch_of_an_unknown_worker_after_id_1_is_a_gap(self) -> None:
        sync = KvSync()
        assert sync.on_batch(_batch("a", 5, _stored(H[:1]))) is Outcome.GAP

    def test_abandoned_dump_applies_the_held_batches(self) -> None:
        sync = KvSync()
        sync.on_batch(_batch("a", 4, _stored(H[:2])))
        assert list(sync.abandon_dump("a")) == [Outcome.APPLIED]
        assert sync.index.find_matches(H) == {"a": 2}

    def test_worker_restart_under_the_same_id_starts_over(self) -> None:
        sync = KvSync()
        sync.on_batch(_batch("a", 1, _stored(H[:3])))
        assert sync.on_batch(_batch("a", 1, AllBlocksCleared(), _stored([77]))) is Outcome.APPLIED
        assert sync.index.blocks_of("a") == frozenset([77])
        sync.on_batch(_batch("a", 2, _stored([78])))
        assert sync.on_batch(_batch("a", 1, _stored(H[:1]))) is Outcome.APPLIED
        assert sync.index.blocks_of("a") == frozenset(H[:1])

    def test_restore_continues_after_the_snapshot(self) -> None:
        sync = KvSync()
        sync.on_batch(_batch("a", 1, _stored(H[:2])), 10)
        sync.on_batch(_batch("a", 2, _stored(H[2:3], H[1])), 11)
        restored = KvSync.restore(sync.snapshot())
        assert restored.stream_seq == 11
        assert restored.on_batch(_batch("a", 2, _stored(H[2:3], H[1])), 11) is Outcome.DUPLICATE
        assert restored.on_batch(_batch("a", 3, _stored(H[3:4], H[2])), 12) is Outcome.APPLIED
        assert restored.index.find_matches(H) == {"a": 4}

    def test_removed_worker_loses_blocks_and_event_ids(self) -> None:
        sync = KvSync()
        sync.on_batch(_batch("a", 1, _stored(H)))
        assert sync.remove_worker("a")
        assert sync.workers() == set()
        assert sync.on_batch(_batch("a", 1, _stored(H[:1]))) is Outcome.APPLIED
