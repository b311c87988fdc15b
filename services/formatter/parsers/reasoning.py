"""Reasoning blocks, ``<think>…</think>``, split from the answer. Pure.

``qwen3``: reasoning only when the output opens with ``<think>`` or the prompt opened the block
(``opened``); a ``<tool_call>`` also ends it (Qwen3 may call a tool without closing the block; the
tag stays in the answer). ``deepseek_r1``: reasoning until ``</think>``, the opening tag optional
(R1's template writes it). A block never closed is all reasoning. Whitespace at the edges of the
block and at the start of the answer after it is layout and dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from services.formatter.parsers._text import find_marker, split_certain
from services.formatter.pieces import Content, Reasoning, TextPiece, tidy

START = "<think>"
END = "</think>"
TOOL_CALL = "<tool_call>"


class _State(Enum):
    LEAD = 0  # before anything but whitespace: is there a <think>?
    THINK = 1
    AFTER = 2  # after </think>: leading whitespace of the answer is dropped
    CONTENT = 3


class ThinkParser:
    """One ``<think>`` block at the start of the output."""

    def __init__(self, *, opened: bool, ends: Sequence[str] = (END,)) -> None:
        self._opened = opened
        self._ends = tuple(ends)
        """What ends the block; all but ``</think>`` stay in the answer."""
        self._state = _State.LEAD
        self._buf = ""
        self._fresh = True  # the reasoning's leading whitespace is still to be dropped

    @property
    def settled(self) -> bool:
        """Past the block (or there was none) with nothing held: all that comes is content."""
        return self._state is _State.CONTENT and not self._buf

    def push(self, text: str) -> list[TextPiece]:
        out: list[TextPiece] = []
        self._buf += text
        while self._buf and self._step(out):
            pass
        return tidy(out)

    def flush(self) -> list[TextPiece]:
        out: list[TextPiece] = []
        if self._state is _State.THINK:
            out.append(Reasoning(self._buf.strip() if self._fresh else self._buf.rstrip()))
        elif self._state is _State.LEAD and self._opened:
            out.append(Reasoning(self._buf.strip()))
        elif self._state in (_State.LEAD, _State.CONTENT):
            out.append(Content(self._buf))
        self._buf, self._state = "", _State.CONTENT
        return tidy(out)

    def _step(self, out: list[TextPiece]) -> bool:
        """Advance on the buffer; ``False`` when more text is needed."""
        if self._state is _State.LEAD:
            body = self._buf.lstrip()
            if body.startswith(START):
                self._buf, self._state = body[len(START) :], _State.THINK
            elif START.startswith(body):
                return False
            else:
                self._state = _State.THINK if self._opened else _State.CONTENT
            return True
        if self._state is _State.THINK:
            return self._think(out)
        if self._state is _State.AFTER:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._state = _State.CONTENT
        out.append(Content(self._buf))
        self._buf = ""
        return False

    def _think(self, out: list[TextPiece]) -> bool:
        if self._fresh:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._fresh = False
        hit = find_marker(self._buf, self._ends)
        if hit is None:
            certain, tail = split_certain(self._buf, self._ends)
            shown = certain.rstrip()  # trailing whitespace may be the block's last
            out.append(Reasoning(shown))
            self._buf = certain[len(shown) :] + tail
            return False
        at, marker = hit
        out.append(Reasoning(self._buf[:at].rstrip()))
        if marker == END:
            self._buf, self._state = self._buf[at + len(END) :], _State.AFTER
        else:
            self._buf, self._state = self._buf[at:], _State.CONTENT
        return True


def qwen3(*, opened: bool = False) -> ThinkParser:
    """Qwen3: ``<think>`` at the start of the output (or opened by the prompt)."""
    return ThinkParser(opened=opened, ends=(END, TOOL_CALL))


def deepseek_r1(*, opened: bool = True) -> ThinkParser:
    """DeepSeek-R1: reasoning until ``</think>``, with or without the opening tag."""
    del opened  # R1's template always opens the block
    return ThinkParser(opened=True)
