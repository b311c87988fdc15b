"""vLLM's KV event wire format → plain records. Pure: bytes in, ``VllmEventBatch`` out.

vLLM's ``ZmqEventPublisher`` sends each batch as three frames ``(topic, seq, payload)``: ``seq``
an 8-byte big-endian counter from 0, ``payload`` a msgpack ``KVEventBatch``
(``vllm/distributed/kv_events.py``). The struct layout changed over time, and a consumer meets
both:

- before vLLM PR #42892 (merged 2026-06; read at commit
  b4e69e0af33f4698e157a262cc787fe61983cd3d): ``array_like=True`` everywhere, an event is
  ``[tag, field, ...]`` in declaration order with trailing defaults omitted; ``BlockStored``
  is ``block_hashes, parent_block_hash, token_ids, block_size, lora_id[, medium, lora_name,
  extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]``,
  ``BlockRemoved`` is ``block_hashes[, medium, group_idx]``;
- after it (read at commit 0181ea3173e53eea8cf04a86891488e3dc89bb34): events are maps with the
  tag under ``"type"``; a batch is ``ts, events, data_parallel_rank``, as an array or a map.

Block hashes are ``int`` (any sign, up to u64) or ``bytes`` (``ExternalBlockHash``); both are
kept as they come, only compared for equality. Unknown fields and event types are ignored
(forward compatible, as Dynamo's ``lib/kv-router/src/zmq_wire`` is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = [
    "END_SEQ",
    "VllmAllBlocksCleared",
    "VllmBlockRemoved",
    "VllmBlockStored",
    "VllmEvent",
    "VllmEventBatch",
    "VllmHash",
    "WireError",
    "decode_batch",
    "decode_seq",
    "encode_seq",
]

VllmHash = int | bytes
END_SEQ = -1
"""The sequence number ending a replay (``ZmqEventPublisher.END_SEQ``, signed)."""


class WireError(ValueError):
    """A frame that is not a vLLM KV event batch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmBlockStored:
    block_hashes: tuple[VllmHash, ...]
    parent_block_hash: VllmHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None = None
    medium: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmBlockRemoved:
    block_hashes: tuple[VllmHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class VllmAllBlocksCleared:
    pass


VllmEvent = VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmEventBatch:
    ts: float
    events: tuple[VllmEvent, ...]
    data_parallel_rank: int | None = None


# --- mirrors of vLLM's structs (every optional field defaulted: older layouts are shorter) ---


class _ArrayEvent(msgspec.Struct, array_like=True, tag=True, omit_defaults=True):
    pass


class _ArrayStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[VllmHash]
    parent_block_hash: VllmHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class _ArrayRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[VllmHash]
    medium: str | None = None
    group_idx: int | None = None


class _ArrayCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


class _MapEvent(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class _MapStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[VllmHash]
    parent_block_hash: VllmHash | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class _MapRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[VllmHash]
    medium: str | None = None
    group_idx: int | None = None


class _MapCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


_ArrayAny = _ArrayStored | _ArrayRemoved | _ArrayCleared
_MapAny = _MapStored | _MapRemoved | _MapCleared
_KNOWN = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})
_decoder = msgspec.msgpack.Decoder()


def encode_seq(seq: int) -> bytes:
    """An 8-byte big-endian sequence number (signed, so ``END_SEQ`` round-trips)."""
    return seq.to_bytes(8, "big", signed=True)


def decode_seq(frame: bytes) -> int:
    """The publisher's sequence number; ``END_SEQ`` (-1) ends a replay."""
    if len(frame) != 8:
        raise WireError(f"a sequence frame has 8 bytes, not {len(frame)}")
    value = int.from_bytes(frame, "big", signed=False)
    return END_SEQ if value == (1 << 64) - 1 else value


def _event(raw: Any) -> VllmEvent | None:
    if isinstance(raw, list):
        if not raw or raw[0] not in _KNOWN:
            return None
        parsed: Any = msgspec.convert(raw, _ArrayAny)
    elif isinstance(raw, dict):
        if raw.get("type") not in _KNOWN:
            return None
        parsed = msgspec.convert(raw, _MapAny)
    else:
        raise WireError(f"a KV event is an array or a map, not {type(raw).__name__}")
    if isinstance(parsed, _ArrayStored | _MapStored):
        return VllmBlockStored(
            block_hashes=tuple(parsed.block_hashes),
            parent_block_hash=parsed.parent_block_hash,
            token_ids=tuple(parsed.token_ids),
            block_size=parsed.block_size,
            lora_name=parsed.lora_name,
            medium=parsed.medium,
            extra_keys=tuple(parsed.extra_keys) if parsed.extra_keys is not None else None,
            group_idx=parsed.group_idx,
            kv_cache_spec_kind=parsed.kv_cache_spec_kind,
        )
    if isinstance(parsed, _ArrayRemoved | _MapRemoved):
        return VllmBlockRemoved(
            block_hashes=tuple(parsed.block_hashes),
            medium=parsed.medium,
            group_idx=parsed.group_idx,
        )
    return VllmAllBlocksCleared()


def decode_batch(payload: bytes) -> VllmEventBatch:
    """A ``KVEventBatch`` payload as records (array or map layout; unknown events skipped)."""
    try:
        raw = _decoder.decode(payload)
        if isinstance(raw, list) and len(raw) >= 2:
            ts, events = raw[0], raw[1]
            rank = raw[2] if len(raw) > 2 else None
        elif isinstance(raw, dict) and "events" in raw:
            ts, events, rank = raw.get("ts", 0.0), raw["events"], raw.get("data_parallel_rank")
        else:
            raise WireError("a KV event batch is [ts, events, ...] or {ts, events, ...}")
        if not isinstance(events, list):
            raise WireError("a KV event batch's events are a list")
        decoded = tuple(e for e in (_event(r) for r in events) if e is not None)
        return VllmEventBatch(
            ts=float(ts), events=decoded, data_parallel_rank=rank if isinstance(rank, int) else None
        )
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError) as exc:
        if isinstance(exc, WireError):
            raise
        raise WireError(f"not a vLLM KV event batch: {exc}") from exc
