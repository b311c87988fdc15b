"""The mock embedding model: token ids → a deterministic, L2-normalized float vector. Pure.

Each token n-gram (n = 1, 2, 3) is hashed (xxh3-64) to a signed unit at one position of the
vector and, with a quarter of its weight or so, to one position within each of the first 1, 2, 4, 16
and 64 (``GUARDS``), so a Matryoshka truncation to any length keeps every feature's trace.
Equal token ids give equal vectors; texts sharing n-grams point the same way (cosine ≈ the
share of common n-grams); unrelated texts are nearly orthogonal. ``dimensions`` truncates the
vector, then renormalizes (as Qwen3-Embedding's Matryoshka representations are used).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import xxhash

NGRAMS = (1, 2, 3)
GUARDS = (1, 2, 4, 16, 64)
"""Widths of the leading spans every feature also lands in (short truncations stay useful)."""
GUARD_WEIGHT = 0.25
_GUARD_BITS = 12
_SIGN = 1 << (_GUARD_BITS - 1)
_TOP = 1 << 63
_PACKERS = {n: struct.Struct(f"<{n}I") for n in NGRAMS}
_xxh3 = xxhash.xxh3_64_intdigest


def embed(token_ids: Sequence[int], size: int) -> list[float]:
    """The unit-length ``size``-float vector of ``token_ids`` (never all zeros)."""
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    acc = [0.0] * size
    guards = [(j * _GUARD_BITS, min(width, size)) for j, width in enumerate(GUARDS)]
    ids = list(token_ids)
    for n in NGRAMS:
        pack = _PACKERS[n].pack
        for i in range(len(ids) - n + 1):
            key = pack(*ids[i : i + n])
            h = _xxh3(key, seed=n)
            acc[h % size] += 1.0 if h & _TOP else -1.0
            g = _xxh3(key, seed=n + len(NGRAMS))
            for shift, width in guards:
                bits = g >> shift  # 6 bits of position (width <= 64), 5 of weight, the sign
                weight = GUARD_WEIGHT * (0.5 + ((bits >> 6) & 31) / 31)
                acc[bits % width] += weight if bits & _SIGN else -weight
    return normalized(acc)


def truncated(vector: Sequence[float], dimensions: int | None) -> list[float]:
    """The first ``dimensions`` values renormalized (Matryoshka); all of them with ``None``."""
    if dimensions is None or dimensions >= len(vector):
        return list(vector)
    if dimensions < 1:
        raise ValueError(f"dimensions must be at least 1, got {dimensions}")
    return normalized(vector[:dimensions])


def normalized(values: Sequence[float]) -> list[float]:
    """``values`` scaled to unit L2 norm; a zero vector becomes the first basis vector."""
    norm = math.sqrt(math.fsum(v * v for v in values))
    if norm == 0.0:
        return [1.0] + [0.0] * (len(values) - 1)
    return [v / norm for v in values]


def to_float32_le(vectors: Sequence[Sequence[float]]) -> bytes:
    """Every vector as little-endian float32, one after the other (``EmbedResult.vectors``)."""
    return b"".join(struct.pack(f"<{len(v)}f", *v) for v in vectors)
