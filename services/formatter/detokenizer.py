"""Incremental detokenization and stop strings for one sequence; token texts for
log-probabilities. Pure: no I/O, no clock.

Text never leaks a stop string, nor a tail that may still grow into one: the longest suffix that
is a prefix of any stop string is held back until it either completes (stop) or cannot anymore.
Nor does it carry control characters (``visible_text``): they are dropped as each piece is
decoded, before stop strings are looked for, so every output format gets the same text.
``TokenTexts`` turns ``TokenBatch.logprobs`` (ids) into ``TokenLogprobs`` (text and UTF-8 bytes).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from services.formatter.pieces import TokenLogprobs, TopLogprob
from shared.messages import TokenLogprob

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""Unicode's control characters (category Cc: C0, DEL, C1) but tab, line feed and carriage
return."""


def visible_text(text: str) -> str:
    """``text`` without control characters (tab, line feed and carriage return kept): a model's
    stray NUL, backspace or ESC (a terminal escape sequence) never reaches a client (Dynamo's
    post-processing filters control characters too)."""
    if text.isprintable():  # almost every piece: no control character, and no cost
        return text
    return _CONTROL.sub("", text)


def load_tokenizer(tokenizer_json: bytes) -> Any:
    """Parse a ``tokenizer.json`` (its bytes, as stored in the model registry)."""
    return Tokenizer.from_buffer(tokenizer_json)


class Detokenizer:
    """Token ids in, client-visible text out; remembers whether and where a stop string hit.

    ``completion_tokens`` counts every id consumed, the EOS / stop token included; once a stop
    string matches, ids after the one that completed it are not consumed (as an engine that
    checks stop strings per token would never have generated them).
    """

    __slots__ = (
        "_context",
        "_include_stop",
        "_max_stop",
        "_pending",
        "_prefixes",
        "_stops",
        "_stream",
        "_tokenizer",
        "completion_tokens",
        "stop_string",
        "stopped",
    )

    def __init__(
        self,
        tokenizer: Any,
        *,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._stops = tuple(s for s in stop if s)
        self._include_stop = include_stop_str_in_output
        self._max_stop = max((len(s) for s in self._stops), default=0)
        # Proper prefixes of every stop string: the tails that must be held back.
        self._prefixes = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))
        self._pending = ""
        """Text decoded but held back (it may be the start of a stop string)."""
        self._context = ""
        """Tail of the emitted text, to find stop strings that span it (include mode only)."""
        self.completion_tokens = 0
        self.stopped = False
        """True once a stop string matched; the request is then finished."""
        self.stop_string: str | None = None
        """The stop string that matched, once one did."""

    def push(self, token_ids: Sequence[int], *, stop_token_id: int | None = None) -> str:
        """Feed the next ids; return the text that may be shown now (possibly ``""``).

        ``stop_token_id`` names the final id as the EOS / stop token that ended generation: it
        is counted but its text is shown only with ``include_stop_str_in_output`` (as vLLM does
        for ``stop_token_ids``).
        """
        if self.stopped:
            return ""
        if stop_token_id is None and not self._stops:  # the per-token common case
            self.completion_tokens += len(token_ids)
            return self._decode(token_ids)
        ids = token_ids
        is_eos = stop_token_id is not None and bool(ids) and not self._include_stop
        if is_eos:
            ids = ids[:-1]
        if self._stops:
            text = self._push_checking_stops(ids)
        else:
            self.completion_tokens += len(ids)
            text = self._decode(ids)
        if is_eos and not self.stopped:
            self.completion_tokens += 1
        return text

    def _decode(self, ids: Sequence[int]) -> str:
        if len(ids) == 1:  # an int is ~0.5 µs cheaper to pass than a one-element sequence
            text = self._stream.step(self._tokenizer, ids[0]) or ""
        else:
            text = (self._stream.step(self._tokenizer, ids) or "") if ids else ""
        return text if text.isprintable() else visible_text(text)  # the call only when needed

    def _push_checking_stops(self, ids: Sequence[int]) -> str:
        # One id at a time, so that a stop string ends generation at the id that completed it.
        out: list[str] = []
        step = self._stream.step
        for token_id in ids:
            self.completion_tokens += 1
            piece = visible_text(step(self._tokenizer, token_id) or "")
            if piece:
                out.append(self._check(piece))
                if self.stopped:
                    break
        return "".join(out)

    def _check(self, piece: str) -> str:
        """Add ``piece``; return what is safe to show, truncating at a stop string."""
        context = self._context
        text = context + self._pending + piece
        hit, end = self._find_stop(text)
        if hit >= 0:
            self.stopped = True
            self.stop_string = text[hit:end]
            self._pending = ""
            cut = end if self._include_stop else hit
            return text[len(context) : max(cut, len(context))]
        if self._include_stop:
            # A partial stop string is shown anyway (it would be kept if it completes), so
            # nothing is held back; keep just enough context to find a match that spans pieces.
            self._context = text[-(self._max_stop - 1) :] if self._max_stop > 1 else ""
            return text[len(context) :]
        held = self._held_back(text)
        self._pending = text[len(text) - held :] if held else ""
        return text[: len(text) - held]

    def _find_stop(self, text: str) -> tuple[int, int]:
        """Earliest stop-string match in ``text``: (start, end), or (-1, -1)."""
        best, best_end = -1, -1
        for stop in self._stops:
            at = text.find(stop)
            if at >= 0 and (best < 0 or at < best):
                best, best_end = at, at + len(stop)
        return best, best_end

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        for k in range(min(len(text), self._max_stop - 1), 0, -1):
            if text[-k:] in self._prefixes:
                return k
        return 0

    def flush(self) -> str:
        """The request finished without a stop-string hit: release the held-back text."""
        pending, self._pending = self._pending, ""
        return "" if self.stopped else pending


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_DECODER = _byte_decoder()


class TokenTexts:
    """A token's text and UTF-8 bytes, as OpenAI's ``logprobs`` objects show them (cached per id).

    Byte-level BPE vocabularies (GPT-2, Llama 3, Qwen) give a token's exact bytes, also for a
    token that holds part of a multi-byte character (its text then shows U+FFFD); other
    vocabularies give the text of the token decoded alone, and its UTF-8 encoding.
    """

    __slots__ = ("_added", "_byte_level", "_cache", "_tokenizer")

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, tuple[int, ...]]] = {}
        self._byte_level = type(getattr(tokenizer, "decoder", None)).__name__ == "ByteLevel"
        added = getattr(tokenizer, "get_added_tokens_decoder", None)
        self._added: dict[int, Any] = added() if callable(added) else {}

    def get(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._lookup(token_id)
        return cached

    def _lookup(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        added = self._added.get(token_id)
        if added is not None:
            text = str(getattr(added, "content", added))
            return text, tuple(text.encode())
        piece = self._tokenizer.id_to_token(token_id) if self._byte_level else None
        if piece is not None and all(c in _BYTE_DECODER for c in piece):
            raw = bytes(_BYTE_DECODER[c] for c in piece)
            return raw.decode("utf-8", errors="replace"), tuple(raw)
        text = self._tokenizer.decode([token_id], skip_special_tokens=False) or ""
        return text, tuple(text.encode())

    def logprobs(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob], top: int
    ) -> list[TokenLogprobs]:
        """``logprobs[i]`` of ``token_ids[i]`` as text, with at most ``top`` alternatives."""
        out = []
        for token_id, lp in zip(token_ids, logprobs, strict=False):
            text, raw = self.get(token_id)
            alternatives = tuple(self._top(alt_id, logprob) for alt_id, logprob in lp.top[:top])
            out.append(TokenLogprobs(text, lp.logprob, raw, alternatives))
        return out

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        text, raw = self.get(token_id)
        return TopLogprob(text, logprob, raw)


_SHARED: weakref.WeakKeyDictionary[Any, TokenTexts] = weakref.WeakKeyDictionary()


def token_texts(tokenizer: Any) -> TokenTexts:
    """The ``TokenTexts`` of ``tokenizer``, shared by every request that uses it (its cache is
    bounded by the vocabulary)."""
    try:
        texts = _SHARED.get(tokenizer)
        if texts is None:
            texts = _SHARED[tokenizer] = TokenTexts(tokenizer)
    except TypeError:  # not weakly referenceable
        return TokenTexts(tokenizer)
    return texts
