"""The paged KV cache: reuse by hash, reference counts, LRU eviction, events, dumps."""

from __future__ import annotations

from services.mocker.kv_cache import BlockTable, KvCache
from shared.messages import AllBlocksCleared, BlockRemoved, BlockStored

BS = 2


def _store(cache: KvCache, hashes: list[int], *, first_token: int = 0) -> BlockTable:
    """A request that computed ``len(hashes)`` full blocks (chained) and still holds them."""
    table = BlockTable()
    assert cache.allocate(table, (), len(hashes))
    for i, h in enumerate(hashes):
        tokens = [first_token + 2 * i, first_token + 2 * i + 1]
        cache.commit(table, h, hashes[i - 1] if i else None, tokens)
    return table


class TestReuse:
    def test_commit_records_one_stored_event_per_chain(self) -> None:
        cache = KvCache(8, BS)
        _store(cache, [11, 12, 13])
        assert cache.take_events() == [
            BlockStored(block_hashes=(11, 12, 13), parent_hash=None, token_ids=(0, 1, 2, 3, 4, 5),
                        block_size=BS)
        ]  # fmt: skip
        assert cache.take_events() == []

    def test_match_returns_the_cached_prefix_only(self) -> None:
        cache = KvCache(8, BS)
        _store(cache, [11, 12, 13])
        assert cache.match([11, 12, 99, 13]) == [11, 12]
        assert cache.match([99, 11]) == []

    def test_shared_blocks_are_counted_once(self) -> None:
        cache = KvCache(8, BS)
        _store(cache, [11, 12])
        other = BlockTable()
        assert cache.allocate(other, [11, 12], 3)
        assert (cache.used_blocks, other.hashes, other.reserved) == (3, [11, 12], 1)

    def test_a_block_stored_twice_is_shared_and_stored_once(self) -> None:
        cache = KvCache(8, BS)
        _store(cache, [11])
        cache.take_events()
        _store(cache, [11])
        assert cache.take_events() == []
        assert (cache.used_blocks, cache.cached_blocks) == (1, 1)

    def test_released_blocks_stay_cached(self) -> None:
        cache = KvCache(8, BS)
        cache.release(_store(cache, [11, 12]))
        assert (cache.used_blocks, cache.cached_blocks, cache.match([11, 12])) == (0, 2, [11, 12])

    def test_without_prefix_caching_nothing_is_cached_or_published(self) -> None:
        cache = KvCache(8, BS, enable_prefix_caching=False)
        table = _store(cache, [11, 12])
        assert (table.reserved, cache.match([11]), cache.take_events()) == (2, [], [])
        cache.release(table)
        assert cache.used_blocks == 0


class TestEviction:
    def test_lru_evicts_the_oldest_free_blocks_tail_first(self) -> None:
        cache = KvCache(5, BS)
        cache.release(_store(cache, [11, 12, 13]))
        cache.release(_store(cache, [21, 22]))
        cache.take_events()
        assert cache.allocate(BlockTable(), (), 2)
        assert cache.take_events() == [BlockRemoved(block_hashes=(13, 12))]
        assert cache.match([11, 12]) == [11]
        assert cache.match([21, 22]) == [21, 22]

    def test_never_used_capacity_goes_before_any_eviction(self) -> None:
        cache = KvCache(4, BS)
        cache.release(_store(cache, [11]))
        cache.take_events()
        assert cache.allocate(BlockTable(), (), 3)
        assert (cache.take_events(), cache.cached_blocks) == ([], 1)

    def test_reused_blocks_are_not_evicted(self) -> None:
        cache = KvCache(3, BS)
        cache.release(_store(cache, [11, 12]))
        table = BlockTable()
        assert cache.allocate(table, [11], 3)  # 11 reused, 12 evicted for the second new block
        assert cache.take_events()[-1] == BlockRemoved(block_hashes=(12,))
        assert cache.match([11]) == [11]

    def test_allocation_that_does_not_fit_changes_nothing(self) -> None:
        cache = KvCache(3, BS)
        held = _store(cache, [11, 12])
        table = BlockTable()
        assert not cache.allocate(table, [11], 4)
        assert (table.num_blocks, cache.used_blocks) == (0, 2)
        cache.release(held)
        assert cache.used_blocks == 0

    def test_clear_drops_free_blocks_and_records_all_blocks_cleared(self) -> None:
        cache = KvCache(4, BS)
        cache.release(_store(cache, [11]))
        held = _store(cache, [21], first_token=100)
        cache.take_events()
        cache.clear()
        assert cache.take_events() == [AllBlocksCleared()]
        assert (cache.match([11]), cache.match([21]), held.hashes) == ([], [21], [21])


class TestDump:
    def test_dump_lists_parents_before_children_one_event_per_branch(self) -> None:
        cache = KvCache(16, BS)
        a = _store(cache, [1, 2, 3])
        b = BlockTable()
        assert cache.allocate(b, [1, 2], 4)
        cache.commit(b, 30, 2, [7, 7])
        cache.commit(b, 31, 30, [8, 8])
        cache.release(a)
        events = cache.dump()
        assert [(e.parent_hash, e.block_hashes) for e in events] == [
            (None, (1, 2, 3)),
            (2, (30, 31)),
        ]
        assert events[1].token_ids == (7, 7, 8, 8)
        assert cache.dump(with_tokens=False)[0].token_ids == ()

    def test_a_block_whose_parent_was_evicted_starts_a_chain(self) -> None:
        cache = KvCache(16, BS)
        table = BlockTable()
        assert cache.allocate(table, (), 1)
        cache.commit(table, 5, 4, [1, 1])  # parent 4 is not cached
        assert [(e.parent_hash, e.block_hashes) for e in cache.dump()] == [(4, (5,))]
