"""Incremental detokenization and stop strings for one request. Pure: no I/O, no clock.

Text never leaks a stop string, nor a tail that may still grow into one: the longest suffix that
is a prefix of any stop string is held back until it either completes (stop) or cannot anymore.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


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
            return self._stream.step(self._tokenizer, ids[0]) or ""
        return (self._stream.step(self._tokenizer, ids) or "") if ids else ""

    def _push_checking_stops(self, ids: Sequence[int]) -> str:
        # One id at a time, so that a stop string ends generation at the id that completed it.
        out: list[str] = []
        step = self._stream.step
        for token_id in ids:
            self.completion_tokens += 1
            piece = step(self._tokenizer, token_id)
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
