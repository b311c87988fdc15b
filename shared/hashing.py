"""KV block hashing, compatible with Dynamo: xxh3-64 with seed 1337 over full blocks.

A block's local hash is xxh3-64 of its token ids as little-endian u32. Sequence hashes chain:
the first block's sequence hash is its local hash; each next one is xxh3-64 of
``LE u64(parent sequence hash) + LE u64(local hash)``. A LoRA name or ``cache_salt`` changes
the seed, so tenants never share cache.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

SEED = 1337


def salted_seed(*, lora_name: str | None = None, cache_salt: str | None = None) -> int:
    """The hash seed for a request: 1337 unless a LoRA name or a cache salt is given."""
    if not lora_name and not cache_salt:
        return SEED
    key = f"{lora_name or ''}\x00{cache_salt or ''}".encode()
    return xxhash.xxh3_64_intdigest(key, seed=SEED)


def block_hash(tokens: Sequence[int], seed: int = SEED) -> int:
    """Local hash of one block of token ids."""
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(tokens)}I", *tokens), seed=seed)


def local_block_hashes(tokens: Sequence[int], block_size: int, seed: int = SEED) -> list[int]:
    """Local hashes of every full block of ``tokens`` (a trailing partial block is ignored)."""
    full = len(tokens) - len(tokens) % block_size
    return [block_hash(tokens[i : i + block_size], seed) for i in range(0, full, block_size)]


def sequence_hashes(local_hashes: Sequence[int], seed: int = SEED) -> list[int]:
    """Chain local block hashes into sequence hashes (each identifies the whole prefix)."""
    out: list[int] = []
    parent: int | None = None
    for h in local_hashes:
        if parent is None:
            seq = h
        else:
            seq = xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent, h), seed=seed)
        out.append(seq)
        parent = seq
    return out
