"""Text helpers every parser shares: marker search that holds back a possible marker start,
the whitespace gap between tool calls and tool-call ids (joining pieces: ``pieces.tidy``). Pure.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

IdFactory = Callable[[], str]


def new_call_id() -> str:
    """An OpenAI-style tool-call id: ``call_`` and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


def find_marker(text: str, markers: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest occurrence of any of ``markers`` in ``text`` from ``start`` (the longest
    marker wins a tie), or ``None``."""
    best: tuple[int, str] | None = None
    for marker in markers:
        at = text.find(marker, start)
        if at >= 0 and (
            best is None or at < best[0] or (at == best[0] and len(marker) > len(best[1]))
        ):
            best = (at, marker)
    return best


def partial_tail(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``:
    the tail to hold back, as it may still grow into a marker."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


def split_certain(text: str, markers: Sequence[str]) -> tuple[str, str]:
    """``text`` without a marker in it, cut into what is certain and the held-back tail."""
    held = partial_tail(text, markers)
    return text[: len(text) - held], text[len(text) - held :]


class Gap:
    """Text around tool calls. Only-whitespace text between (or after) calls is dropped; a
    whitespace-only run before the first call is dropped too, unless no call ever comes."""

    __slots__ = ("_held", "_open", "calls_seen")

    def __init__(self) -> None:
        self._held = ""
        self._open = True
        self.calls_seen = False

    def text(self, text: str) -> str:
        """What to show of ``text`` now."""
        if not self._open:
            return text
        if not text or text.isspace():
            self._held += text
            return ""
        shown, self._held, self._open = self._held + text, "", False
        return shown

    def call_starts(self) -> None:
        """A call begins: a whitespace-only run before it is dropped."""
        self._held, self._open, self.calls_seen = "", False, True

    def call_ends(self) -> None:
        """A call ended: whitespace after it is held until something else shows up."""
        self._held, self._open = "", True

    def flush(self) -> str:
        """At the end: the held whitespace, kept only when no call was made."""
        held, self._held = self._held, ""
        return "" if self.calls_seen else held
