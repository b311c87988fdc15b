"""vLLM KV events → JetServe events: hashes recomputed with ``shared.hashing``, parents and
removals resolved through the vLLM → JetServe map, foreign blocks dropped (as Dynamo's
``lib/kv-router/src/zmq_wire/convert.rs`` drops blocks of another size), and sequence gaps."""

from __future__ import annotations

from services.vllm_worker.kv_relay import Gap, KvRelay
from services.vllm_worker.kv_wire import (
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEvent,
    VllmEventBatch,
)
from services.vllm_worker.sampling import SALT_PREFIX
from shared.hashing import prefix_hashes, salted_seed
from shared.messages import AllBlocksCleared, BlockRemoved, BlockStored

BS = 4
TOKENS = tuple(range(100, 124))  # 6 blocks


def batch(*events: VllmEvent) -> VllmEventBatch:
    return VllmEventBatch(ts=0.0, events=events)


def stored(
    hashes: list[int | bytes],
    first: int,
    parent: int | bytes | None = None,
    tokens: tuple[int, ...] = TOKENS,
    **kw: object,
) -> VllmBlockStored:
    ids = tokens[first * BS : (first + len(hashes)) * BS]
    fields: dict[str, object] = {"block_size": BS, **kw}
    return VllmBlockStored(
        block_hashes=tuple(hashes),
        parent_block_hash=parent,
        token_ids=ids,
        **fields,  # type: ignore[arg-type]
    )


def test_stored_blocks_get_jetserve_hashes_and_chain_through_parents() -> None:
    relay = KvRelay(block_size=BS)
    first = relay.relay(batch(stored([11, 12], 0)))
    second = relay.relay(batch(stored([13, 14, 15], 2, parent=12)))
    expected = prefix_hashes(TOKENS[: 5 * BS], BS)
    assert first == [
        BlockStored(
            block_hashes=tuple(expected[:2]),
            parent_hash=None,
            token_ids=TOKENS[: 2 * BS],
            block_size=BS,
        )
    ]
    assert second == [
        BlockStored(
            block_hashes=tuple(expected[2:5]),
            parent_hash=expected[1],
            token_ids=TOKENS[2 * BS : 5 * BS],
            block_size=BS,
        )
    ]
    assert len(relay) == 5


def test_bytes_hashes_work_like_ints() -> None:
    relay = KvRelay(block_size=BS)
    relay.relay(batch(stored([b"a", b"b"], 0)))
    out = relay.relay(batch(stored([b"c"], 2, parent=b"b"), VllmBlockRemoved(block_hashes=(b"a",))))
    expected = prefix_hashes(TOKENS[: 3 * BS], BS)
    assert out[0] == BlockStored(
        block_hashes=(expected[2],), parent_hash=expected[1], token_ids=TOKENS[8:12], block_size=BS
    )
    assert out[1] == BlockRemoved(block_hashes=(expected[0],))


def test_removals_report_the_jetserve_hash_and_forget_it() -> None:
    relay = KvRelay(block_size=BS)
    relay.relay(batch(stored([11, 12], 0)))
    expected = prefix_hashes(TOKENS[: 2 * BS], BS)
    assert relay.relay(batch(VllmBlockRemoved(block_hashes=(12, 99)))) == [
        BlockRemoved(block_hashes=(expected[1],))
    ]
    assert relay.relay(batch(VllmBlockRemoved(block_hashes=(12,)))) == []  # already gone
    assert relay.relay(batch(stored([13], 2, parent=12))) == []  # its parent is unknown now
    assert relay.dropped_blocks == 1
    assert len(relay) == 1


def test_blocks_of_another_size_are_dropped() -> None:
    relay = KvRelay(block_size=BS)
    odd = VllmBlockStored(
        block_hashes=(1, 2), parent_block_hash=None, token_ids=TOKENS[:16], block_size=8
    )
    assert relay.relay(batch(odd)) == []
    assert relay.dropped_blocks == 2
    assert len(relay) == 0


def test_short_token_ids_relay_only_the_full_blocks() -> None:
    relay = KvRelay(block_size=BS)
    short = VllmBlockStored(
        block_hashes=(1, 2, 3), parent_block_hash=None, token_ids=TOKENS[:9], block_size=BS
    )
    (event,) = relay.relay(batch(short))
    assert isinstance(event, BlockStored)
    assert event.block_hashes == tuple(prefix_hashes(TOKENS[:8], BS))
    assert relay.dropped_blocks == 1


def test_other_media_and_groups_are_not_ours() -> None:
    relay = KvRelay(block_size=BS)
    assert relay.relay(batch(stored([1], 0, medium="CPU"))) == []
    assert relay.relay(batch(stored([2], 0, group_idx=1))) == []
    assert relay.relay(batch(stored([3], 0, kv_cache_spec_kind="sliding_window"))) == []
    assert relay.relay(batch(stored([4], 0, medium="GPU", group_idx=0))) != []
    assert relay.relay(batch(VllmBlockRemoved(block_hashes=(4,), medium="CPU"))) == []
    assert len(relay) == 1


def test_all_blocks_cleared_forgets_everything() -> None:
    relay = KvRelay(block_size=BS)
    relay.relay(batch(stored([1, 2], 0)))
    assert relay.relay(batch(VllmAllBlocksCleared())) == [AllBlocksCleared()]
    assert relay.relay(batch(VllmBlockRemoved(block_hashes=(1,)))) == []
    assert len(relay) == 0


def test_lora_blocks_use_the_lora_seed() -> None:
    relay = KvRelay(block_size=BS)
    (event,) = relay.relay(batch(stored([1, 2], 0, lora_name="adapter")))
    assert isinstance(event, BlockStored)
    assert list(event.block_hashes) == prefix_hashes(TOKENS[:8], BS, lora_name="adapter")
    assert event.lora_name == "adapter"
    (child,) = relay.relay(batch(stored([3], 2, parent=2, lora_name="adapter")))
    assert isinstance(child, BlockStored)
    assert child.block_hashes[0] == prefix_hashes(TOKENS[:12], BS, lora_name="adapter")[2]


def test_a_salt_in_extra_keys_names_the_seed() -> None:
    seed = salted_seed(cache_salt="tenant")
    relay = KvRelay(block_size=BS)
    keys = ((f"{SALT_PREFIX}{seed:x}",), None)
    (event,) = relay.relay(batch(stored([1, 2], 0, extra_keys=keys)))
    assert isinstance(event, BlockStored)
    assert list(event.block_hashes) == prefix_hashes(TOKENS[:8], BS, cache_salt="tenant")
    (child,) = relay.relay(batch(stored([3], 2, parent=2)))  # children inherit the seed
    assert isinstance(child, BlockStored)
    assert child.block_hashes[0] == prefix_hashes(TOKENS[:12], BS, cache_salt="tenant")[2]


def test_without_extra_keys_a_hint_names_the_seed() -> None:
    seed = salted_seed(cache_salt="tenant")
    relay = KvRelay(block_size=BS)
    relay.hint(TOKENS, None, seed)
    relay.hint(TOKENS[:2], None, seed)  # shorter than a block: ignored
    (event,) = relay.relay(batch(stored([1], 0)))
    assert isinstance(event, BlockStored)
    assert list(event.block_hashes) == prefix_hashes(TOKENS[:4], BS, cache_salt="tenant")
    other = tuple(range(500, 504))
    (plain,) = relay.relay(batch(stored([9], 0, tokens=other)))
    assert isinstance(plain, BlockStored)
    assert list(plain.block_hashes) == prefix_hashes(other, BS)


def test_sequence_numbers_detect_gaps_and_duplicates() -> None:
    relay = KvRelay(block_size=BS)
    assert relay.check(0) is True
    relay.apply(0, batch())
    assert relay.check(0) is False
    assert relay.check(3) == Gap(1)
    relay.apply(1, batch(stored([1], 0)))
    assert relay.next_seq == 2
    assert relay.check(2) is True


def test_a_lost_gap_clears_and_resumes() -> None:
    relay = KvRelay(block_size=BS)
    relay.apply(0, batch(stored([1, 2], 0)))
    assert relay.lost(7) == [AllBlocksCleared()]
    assert relay.next_seq == 7
    assert len(relay) == 0
    assert relay.check(7) is True


def test_dump_lists_what_is_cached_parents_first_in_runs() -> None:
    relay = KvRelay(block_size=BS)
    relay.relay(batch(stored([1, 2], 0)))
    relay.relay(batch(stored([3], 2, parent=2)))
    branch = TOKENS[:8] + tuple(range(900, 904))
    relay.relay(batch(stored([4], 2, parent=2, tokens=branch)))
    main = prefix_hashes(TOKENS[:12], BS)
    side = prefix_hashes(branch, BS)
    assert relay.dump(with_tokens=True) == [
        BlockStored(
            block_hashes=tuple(main), parent_hash=None, token_ids=TOKENS[:12], block_size=BS
        ),
        BlockStored(
            block_hashes=(side[2],), parent_hash=main[1], token_ids=branch[8:], block_size=BS
        ),
    ]
    relay.relay(batch(VllmBlockRemoved(block_hashes=(1,))))
    (orphans, other) = relay.dump(with_tokens=False)
    assert orphans == BlockStored(
        block_hashes=(main[1], main[2]), parent_hash=main[0], block_size=BS
    )
    assert other.parent_hash == main[1]
    assert KvRelay(block_size=BS).dump(with_tokens=True) == []
