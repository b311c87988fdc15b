"""KV block hashing, compatible with Dynamo: xxh3-64 with seed 1337 over full blocks.

A block's local hash is xxh3-64 of its token ids as little-endian u32. Sequence hashes chain:
the first block's sequence hash is its local hash; each next one is xxh3-64 (seed 1337) of
``LE u64(parent sequence hash) + LE u64(local hash)``. A LoRA name or a ``cache_salt`` changes
the *local* seed exactly as Dynamo 1.6.1 does (``compute_block_hash_for_seq(tokens, block_size,
lora_name=..., cache_namespace=...)``): ``1337 + xxh3(lora, seed 0) + xxh3(salt, seed 1)``,
wrapping at 2**64, empty strings counting as absent. The chain seed stays 1337 (Dynamo's
``compute_next_sequence_hash``); a salted first block already separates the whole chain.

Images (decision 032): a block holding any of an image's placeholder tokens hashes its tokens
followed by the sorted LE u64 routing hashes of those images, as Dynamo's
``compute_block_hash_for_seq`` does with ``block_mm_infos``; so the same image at the same
place matches and another image of the same size does not.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Mapping, Sequence

import xxhash

SEED = 1337
_MASK = (1 << 64) - 1
_PAIR = struct.Struct("<QQ")
_xxh3 = xxhash.xxh3_64_intdigest

MmSpan = tuple[int, int, int]
"""An image's placeholder tokens in a prompt: ``(offset, length, routing hash)``."""


def salted_seed(*, lora_name: str | None = None, cache_salt: str | None = None) -> int:
    """The local-hash seed for a request: 1337 unless a LoRA name or a cache salt is given.

    Matches Dynamo 1.6.1 bit for bit (golden vectors in ``tests/unit/shared/test_hashing.py``);
    ``cache_salt`` plays the part of Dynamo's ``cache_namespace``.
    """
    seed = SEED
    if lora_name:
        seed = (seed + _xxh3(lora_name.encode(), seed=0)) & _MASK
    if cache_salt:
        seed = (seed + _xxh3(cache_salt.encode(), seed=1)) & _MASK
    return seed


def _le_u32(tokens: Sequence[int]) -> memoryview:
    packed = array("I", tokens)
    if packed.itemsize != 4:  # pragma: no cover - every supported platform has 4-byte "I"
        return memoryview(struct.pack(f"<{len(tokens)}I", *tokens))
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian hosts
        packed.byteswap()
    return memoryview(packed).cast("B")


def block_hash(tokens: Sequence[int], seed: int = SEED, mm: Sequence[int] = ()) -> int:
    """Local hash of one block of token ids (and of the images ``mm`` with tokens in it)."""
    if not mm:
        return _xxh3(_le_u32(tokens), seed=seed)
    extra = struct.pack(f"<{len(mm)}Q", *sorted(mm))
    return _xxh3(_le_u32(tokens).tobytes() + extra, seed=seed)


def block_images(images: Sequence[MmSpan], block_size: int) -> dict[int, tuple[int, ...]]:
    """Block index -> the routing hashes of the images with a placeholder token in it."""
    out: dict[int, list[int]] = {}
    for offset, length, mm_hash in images:
        if length <= 0:
            continue
        for block in range(offset // block_size, (offset + length - 1) // block_size + 1):
            out.setdefault(block, []).append(mm_hash)
    return {block: tuple(hashes) for block, hashes in out.items()}


def local_block_hashes(
    tokens: Sequence[int],
    block_size: int,
    seed: int = SEED,
    mm: Mapping[int, Sequence[int]] | None = None,
) -> list[int]:
    """Local hashes of every full block of ``tokens`` (a trailing partial block is ignored);
    ``mm``: ``block_images`` of the prompt's images."""
    data = _le_u32(tokens)
    step = block_size * 4
    full = (len(tokens) // block_size) * step
    out = [_xxh3(data[i : i + step], seed) for i in range(0, full, step)]
    for block, hashes in (mm or {}).items():
        if 0 <= block < len(out):
            start = block * block_size
            out[block] = block_hash(tokens[start : start + block_size], seed, hashes)
    return out


def sequence_hashes(local_hashes: Sequence[int], seed: int = SEED) -> list[int]:
    """Chain local block hashes into sequence hashes (each identifies the whole prefix)."""
    if not local_hashes:
        return []
    parent = local_hashes[0]
    out = [parent]
    append = out.append
    if _PAIR.pack(1, 2) != array("Q", [1, 2]).tobytes():  # pragma: no cover - big-endian
        for h in local_hashes[1:]:
            parent = _xxh3(_PAIR.pack(parent, h), seed)
            append(parent)
        return out
    pair = array("Q", (0, 0))  # reused buffer: LE u64 parent, LE u64 local
    for h in local_hashes[1:]:
        pair[0] = parent
        pair[1] = h
        parent = _xxh3(pair, seed)
        append(parent)
    return out


def prefix_hashes(
    tokens: Sequence[int],
    block_size: int,
    *,
    lora_name: str | None = None,
    cache_salt: str | None = None,
    images: Sequence[MmSpan] = (),
) -> list[int]:
    """Sequence hashes of every full block of a prompt, salted as Dynamo salts them.

    This is what a worker publishes in ``BlockStored.block_hashes`` and what the router looks up.
    """
    seed = salted_seed(lora_name=lora_name, cache_salt=cache_salt)
    mm = block_images(images, block_size) if images else None
    return sequence_hashes(local_block_hashes(tokens, block_size, seed, mm))


def extend_prefix_hashes(
    tokens: Sequence[int],
    block_size: int,
    known: Sequence[int],
    *,
    lora_name: str | None = None,
    cache_salt: str | None = None,
    images: Sequence[MmSpan] = (),
) -> Sequence[int]:
    """``prefix_hashes(tokens, ...)``, given ``known``: those of a prefix of ``tokens`` (the
    preprocessor's, same block size and salt), so only the full blocks past it are hashed.

    A block's sequence hash depends only on the tokens up to its end, so the hashes of a prompt
    are those of any prefix of it, followed by the new blocks' (a migrated request's prompt is
    its original prompt plus the tokens generated so far). ``known`` longer than ``tokens`` has
    full blocks cannot be such a prefix: everything is hashed afresh.
    """
    full = len(tokens) // block_size
    have = len(known)
    if have == full:
        return known
    if have == 0 or have > full:
        return prefix_hashes(
            tokens, block_size, lora_name=lora_name, cache_salt=cache_salt, images=images
        )
    seed = salted_seed(lora_name=lora_name, cache_salt=cache_salt)
    mm = {b - have: h for b, h in block_images(images, block_size).items() if b >= have}
    tail = local_block_hashes(tokens[have * block_size :], block_size, seed, mm)
    chained = sequence_hashes([known[-1], *tail])  # the first is already a sequence hash
    return [*known, *chained[1:]]
