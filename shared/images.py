"""Pure: a prompt's images as the block hashes see them (decision 032).

An image's identity is the sha256 of its file's bytes (``ImageInput.mm_hash``, 64 hex digits);
its routing hash is the first 16 of them read as a u64, the mapping Dynamo's
``hash_mm_identifier`` applies to vLLM's 64-digit hex ids. The preprocessor, the router and the
mocker all fold the same ``(offset, length, routing hash)`` spans into the same blocks
(``shared.hashing.block_images``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from shared.hashing import MmSpan
from shared.messages import ImageInput


def image_id(data: bytes) -> str:
    """An image file's identity: sha256 of its bytes, 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


def routing_hash(mm_hash: str) -> int:
    """The u64 an image's id contributes to block hashes: its first 16 hex digits."""
    return int(mm_hash[:16], 16)


def mm_spans(images: Sequence[ImageInput]) -> tuple[MmSpan, ...]:
    """``(offset, length, routing hash)`` of each image, for ``shared.hashing``."""
    return tuple((i.offset, i.length, routing_hash(i.mm_hash)) for i in images)
