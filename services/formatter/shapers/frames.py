"""What the shapers share: SSE frames cut from a real encoded chunk, the text of pieces, and the
streaming skeleton of the two OpenAI shapers (``OpenAIShaper``).

The per-token content frame of the OpenAI shapers is a precomputed head + the JSON-escaped text
+ tail, cut from a chunk encoded with a marker as its text, so it is byte-identical to the
Struct path at a fraction of the cost (it is what keeps c=64 streaming cheap). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import msgspec
from msgspec import UNSET

from services.formatter.pieces import ChoiceEnd, Content, Piece, Reasoning, TokenLogprobs
from services.formatter.shaping import Nvext, Usage
from shared import sse
from shared.messages import StreamOpen

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


class OpenAIShaper:
    """The OpenAI chat and completion shapers' common part: the chunk envelope, the content-frame
    templates, the last finish held until ``closing`` (so that it carries ``nvext``), the usage
    chunk and ``[DONE]``. A subclass says what a text choice and a finish choice look like."""

    __slots__ = ("_ended", "_frames", "_id", "_include_usage", "_last", "_n", "_open")

    chunk_type: ClassVar[type[Any]]
    """The streamed object (``ChatCompletionChunk``, ``Completion``)."""

    def __init__(self, open_: StreamOpen, id_prefix: str) -> None:
        self._open = open_
        self._id = id_prefix + open_.request_id
        self._include_usage = open_.output.include_usage
        self._n = max(1, open_.output.n)
        self._ended = 0
        self._last: tuple[int, ChoiceEnd, Usage | None] | None = None
        """The last choice's finish, held for ``closing``."""
        self._frames = Templates(lambda index: self._chunk([self._text_choice(index, MARK)]))

    def _text_choice(self, index: int, text: str) -> msgspec.Struct:
        """A streamed choice carrying only ``text`` (the content-frame template)."""
        raise NotImplementedError

    def _finish_choice(self, index: int, end: ChoiceEnd) -> msgspec.Struct:
        """A streamed choice carrying only its ``finish_reason``."""
        raise NotImplementedError

    def _envelope(
        self,
        kind: type[Any],
        choices: list[Any],
        usage: Any,
        nvext: Nvext | None = None,
    ) -> msgspec.Struct:
        """A ``kind`` object of this request (id, created, model) around ``choices``."""
        return kind(  # type: ignore[no-any-return]
            id=self._id,
            created=self._open.created,
            model=self._open.model,
            choices=choices,
            usage=usage,
            nvext=UNSET if nvext is None else nvext,
        )

    def _chunk(
        self, choices: list[Any], usage: Usage | None = None, nvext: Nvext | None = None
    ) -> msgspec.Struct:
        """A streamed chunk; ``usage`` shows only with ``include_usage``."""
        return self._envelope(
            self.chunk_type, choices, usage if self._include_usage else UNSET, nvext
        )

    def text_delta(self, choice: int, text: str) -> bytes:
        return self._frames.frame(choice, text)

    def choice_end(self, choice: int, end: ChoiceEnd, usage: Usage | None = None) -> bytes:
        self._ended += 1
        if self._ended >= self._n:
            self._last = (choice, end, usage)
            return b""
        return self._finish(choice, end, usage)

    def _finish(
        self, choice: int, end: ChoiceEnd, usage: Usage | None, nvext: Nvext | None = None
    ) -> bytes:
        return sse.frame(encode(self._chunk([self._finish_choice(choice, end)], usage, nvext)))

    def closing(self, usage: Usage, nvext: Nvext | None = None) -> bytes:
        out = b"" if self._last is None else self._finish(*self._last, nvext)
        if self._include_usage:
            out += sse.frame(encode(self._chunk([], usage)))
        return out + sse.DONE
