"""Decoding vLLM's ``KVEventBatch`` payloads in both layouts (``vllm/distributed/kv_events.py``:
``array_like`` at commit b4e69e0af33f4698e157a262cc787fe61983cd3d and in vLLM 0.11+, maps after
PR #42892 at commit 0181ea3173e53eea8cf04a86891488e3dc89bb34)."""

from __future__ import annotations

import msgspec
import pytest

from services.vllm_worker.kv_wire import (
    END_SEQ,
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    WireError,
    decode_batch,
    decode_seq,
    encode_seq,
)
from tests.fakes.vllm_fakes import Cleared, Removed, Stored, encode_batch

EVENTS = [
    Stored(
        block_hashes=[1, -2],
        parent_block_hash=None,
        token_ids=list(range(8)),
        block_size=4,
        lora_name="ad",
        extra_keys=[("salt",), None],
    ),
    Removed(block_hashes=[b"\x01" * 32]),
    Cleared(),
]


@pytest.mark.parametrize("layout", ["array", "map"])
def test_both_layouts_decode_to_the_same_records(layout: str) -> None:
    batch = decode_batch(encode_batch(EVENTS, layout, ts=5.0))  # type: ignore[arg-type]
    assert batch.ts == 5.0
    assert batch.data_parallel_rank == 0
    stored, removed, cleared = batch.events
    assert isinstance(stored, VllmBlockStored)
    assert stored.block_hashes == (1, -2)
    assert stored.parent_block_hash is None
    assert stored.token_ids == tuple(range(8))
    assert (stored.block_size, stored.lora_name, stored.medium) == (4, "ad", "GPU")
    assert stored.extra_keys == (["salt"], None)
    assert removed == VllmBlockRemoved(block_hashes=(b"\x01" * 32,), medium="GPU")
    assert cleared == VllmAllBlocksCleared()


def test_the_oldest_array_layout_without_medium_decodes() -> None:
    """vLLM 0.9: ``BlockStored`` ends at ``lora_id``, ``BlockRemoved`` is only hashes."""
    payload = msgspec.msgpack.encode(
        [1.0, [["BlockStored", [9], 8, [1, 2], 2, None], ["BlockRemoved", [8]]]]
    )
    stored, removed = decode_batch(payload).events
    assert stored == VllmBlockStored(
        block_hashes=(9,), parent_block_hash=8, token_ids=(1, 2), block_size=2
    )
    assert removed == VllmBlockRemoved(block_hashes=(8,))


def test_unknown_events_and_fields_are_skipped() -> None:
    payload = msgspec.msgpack.encode(
        {
            "ts": 1.0,
            "events": [
                {"type": "BlockMoved", "x": 1},
                ["Unknown", 1],
                {"type": "AllBlocksCleared", "future_field": 3},
            ],
            "data_parallel_rank": 1,
            "later": True,
        }
    )
    batch = decode_batch(payload)
    assert batch.events == (VllmAllBlocksCleared(),)
    assert batch.data_parallel_rank == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        msgspec.msgpack.encode(3),
        msgspec.msgpack.encode([1.0, 2]),
        msgspec.msgpack.encode([1.0, [["BlockStored", "not-a-list"]]]),
        msgspec.msgpack.encode([1.0, [7]]),
    ],
)
def test_malformed_payloads_are_wire_errors(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_batch(payload)


def test_sequence_frames() -> None:
    assert decode_seq((5).to_bytes(8, "big")) == 5
    assert decode_seq((-1).to_bytes(8, "big", signed=True)) == END_SEQ
    assert decode_seq(encode_seq(END_SEQ)) == END_SEQ
    assert encode_seq(7) == (7).to_bytes(8, "big")
    with pytest.raises(WireError):
        decode_seq(b"\x00")
