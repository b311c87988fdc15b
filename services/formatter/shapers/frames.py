"""What the shapers share: SSE frames cut from a real encoded chunk, and the text of pieces.

The per-token content frame of the OpenAI shapers is a precomputed head + the JSON-escaped text
+ tail, cut from a chunk encoded with a marker as its text, so it is byte-identical to the
Struct path at a fraction of the cost (it is what keeps c=64 streaming cheap). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from services.formatter.pieces import Content, Piece, Reasoning, TokenLogprobs
from services.formatter.shaping import Usage
from shared import sse

MARK = "\x00"
"""The text a template chunk is encoded with; found again as ``MARK_JSON``."""
MARK_JSON = b'"\\u0000"'

encode: Callable[[Any], bytes] = msgspec.json.Encoder().encode


def template(encoded: bytes) -> tuple[bytes, bytes]:
    """Split an encoded chunk whose text is ``MARK`` into SSE head and tail."""
    head, _, tail = encoded.partition(MARK_JSON)
    return sse.PREFIX + head, tail + sse.END


class Templates:
    """Content-frame templates per choice index, made on first use from ``chunk(index)``."""

    __slots__ = ("_chunk", "_head", "_made", "_tail")

    def __init__(self, chunk: Callable[[int], msgspec.Struct]) -> None:
        self._chunk = chunk
        self._made: dict[int, tuple[bytes, bytes]] = {}
        self._head, self._tail = self._made[0] = template(encode(chunk(0)))

    def frame(self, index: int, text: str) -> bytes:
        if not index:
            return self._head + encode(text) + self._tail
        made = self._made.get(index)
        if made is None:
            made = self._made[index] = template(encode(self._chunk(index)))
        return made[0] + encode(text) + made[1]


def plain_text(
    pieces: Sequence[Piece], logprobs: Sequence[TokenLogprobs], usage: Usage | None
) -> str | None:
    """The text of a delta that is one ``Content`` and nothing else (the fast path), or ``None``."""
    if usage is None and not logprobs and len(pieces) == 1:
        piece = pieces[0]
        if type(piece) is Content:
            return piece.text
    return None


def text_of(pieces: Sequence[Piece]) -> str:
    """Content and reasoning text, in order (formats without a place for reasoning or tools)."""
    return "".join(p.text for p in pieces if isinstance(p, Content | Reasoning))
