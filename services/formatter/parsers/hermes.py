"""Hermes tool calls (Qwen2.5, Qwen3, NousResearch Hermes). Pure.

The model writes ``<tool_call>\n{"name": "<fn>", "arguments": {…}}\n</tool_call>`` per call.
A call is shown (``ToolCallStart``) once its name is known and its arguments have begun to parse;
then they stream as they come. A call that breaks before it is shown is given back as content,
from ``<tool_call>`` to ``</tool_call>``; one that breaks later has its arguments closed into
valid JSON and the rest of its block dropped (what was shown cannot be taken back).
"""

from __future__ import annotations

from enum import Enum

from services.formatter.parsers._calls import CallObject, Status, closing_pieces
from services.formatter.parsers._text import (
    Gap,
    IdFactory,
    find_marker,
    new_call_id,
    partial_tail,
    split_certain,
)
from services.formatter.pieces import Content, ToolCallArgs, ToolCallStart, ToolPiece, tidy

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_ENDS = (CLOSE, OPEN)


class _State(Enum):
    TEXT = 0
    CALL = 1
    DROP = 2  # after a shown call: dropped until </tool_call> (or the next <tool_call>)
    SHOW = 3  # after a call broken before its name: content until </tool_call>


class HermesParser:
    """``<tool_call>{json}</tool_call>`` blocks in answer text."""

    def __init__(self, *, ids: IdFactory = new_call_id) -> None:
        self._ids = ids
        self._state = _State.TEXT
        self._buf = ""
        self._gap = Gap()
        self._call: CallObject | None = None
        self._shown = False
        """Whether the current call's ``ToolCallStart`` went out."""
        self._index = -1

    def push(self, text: str) -> list[ToolPiece]:
        out: list[ToolPiece] = []
        self._buf += text
        self._run(out)
        return tidy(out)

    def flush(self) -> list[ToolPiece]:
        call = self._call if self._state is _State.CALL else None
        text: str | None = None
        if call is not None:
            text = OPEN + call.raw + self._buf
        elif self._state in (_State.TEXT, _State.SHOW):
            text = self._buf
        out = closing_pieces(self._gap, call, shown=self._shown, index=self._index, text=text)
        self._buf, self._state, self._call = "", _State.TEXT, None
        return out

    def _run(self, out: list[ToolPiece]) -> None:
        while self._buf or (self._state is _State.CALL and self._call is not None):
            if self._state is _State.TEXT:
                hit = find_marker(self._buf, (OPEN,))
                if hit is None:
                    shown, self._buf = split_certain(self._buf, (OPEN,))
                    out.append(Content(self._gap.text(shown)))
                    return
                out.append(Content(self._gap.text(self._buf[: hit[0]])))
                self._buf = self._buf[hit[0] + len(OPEN) :]
                self._state, self._call, self._shown = _State.CALL, CallObject(), False
            elif self._state is _State.CALL:
                if not self._step_call(out):
                    return
            elif not self._skip(out):
                return

    def _step_call(self, out: list[ToolPiece]) -> bool:
        """Feed the call; ``False`` when it needs more text."""
        call = self._call
        assert call is not None
        end = call.feed(self._buf)
        self._buf = self._buf[end:]
        if not self._shown and call.ready and call.name is not None:
            self._index += 1
            out.append(ToolCallStart(self._index, self._ids(), call.name))
            self._gap.call_starts()
            self._shown = True
        if self._shown:
            out.append(ToolCallArgs(self._index, call.take()))
        if call.status is Status.RUNNING:
            return False
        if self._shown:
            out.append(ToolCallArgs(self._index, call.close()))
            self._state = _State.DROP
        else:
            out.append(Content(self._gap.text(OPEN + call.raw)))
            self._state = _State.SHOW
        self._call = None
        return True

    def _skip(self, out: list[ToolPiece]) -> bool:
        """Up to the end of the current block: dropped (``DROP``) or shown (``SHOW``);
        ``False`` when the end is not in sight yet."""
        show = self._state is _State.SHOW
        hit = find_marker(self._buf, _ENDS)
        if hit is None:
            held = partial_tail(self._buf, _ENDS)
            if show:
                out.append(Content(self._buf[: len(self._buf) - held]))
            self._buf = self._buf[len(self._buf) - held :]
            return False
        at, marker = hit
        end = at + len(CLOSE) if marker == CLOSE else at
        if show:
            out.append(Content(self._buf[:end]))
        else:
            self._gap.call_ends()
        self._buf = self._buf[end:]
        self._state = _State.TEXT
        return True
