"""Mistral tool calls. Pure.

``[TOOL_CALLS][{"name": "<fn>", "arguments": {…}}, …]`` (text before it is content), and the v11
form ``[TOOL_CALLS]<fn>[ARGS]{…}`` (one marker per call; ``[CALL_ID]<id>`` before ``[ARGS]`` is
skipped, a missing ``[ARGS]`` tolerated). A call is shown once its name is known and its
arguments have begun; they stream. Something that breaks the syntax before a call is shown gives
the text back as content from ``[TOOL_CALLS]`` on; after a shown call, the rest is content.
"""

from __future__ import annotations

import re
from enum import Enum

from services.formatter.parsers._calls import CallObject, Status, closing_pieces
from services.formatter.parsers._json import WHITESPACE
from services.formatter.parsers._text import (
    Gap,
    IdFactory,
    find_marker,
    new_call_id,
    split_certain,
)
from services.formatter.pieces import Content, ToolCallArgs, ToolCallStart, ToolPiece, tidy

MARKER = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")


class _State(Enum):
    TEXT = 0
    OPEN = 1  # after [TOOL_CALLS]: "[", "{" or a v11 name
    ELEMENT = 2  # in the array: "{" expected
    NEXT = 3  # in the array after a call: "," or "]"
    NAME = 4  # v11 name, up to [ARGS]
    CALL_ID = 5  # v11 call id, up to [ARGS]
    CALL = 6
    CONTENT = 7  # the rest of the answer is content


class MistralParser:
    """``[TOOL_CALLS]`` in answer text, both the JSON-array and the v11 forms."""

    def __init__(self, *, ids: IdFactory = new_call_id) -> None:
        self._ids = ids
        self._state = _State.TEXT
        self._buf = ""
        self._held = ""
        """Text since [TOOL_CALLS] while no call of it was shown: content if it breaks."""
        self._gap = Gap()
        self._call: CallObject | None = None
        self._in_array = False
        self._name = ""
        self._shown = False
        self._index = -1

    def push(self, text: str) -> list[ToolPiece]:
        out: list[ToolPiece] = []
        self._buf += text
        while (self._buf or self._state is _State.CALL) and self._step(out):
            pass
        return tidy(out)

    def flush(self) -> list[ToolPiece]:
        call = self._call if self._state is _State.CALL else None
        text = self._held + (call.raw if call else "") + self._buf
        out = closing_pieces(self._gap, call, shown=self._shown, index=self._index, text=text)
        self._buf, self._held, self._call, self._state = "", "", None, _State.CONTENT
        return out

    def _step(self, out: list[ToolPiece]) -> bool:
        """Advance on the buffer; ``False`` when more text is needed."""
        state = self._state
        if state is _State.TEXT:
            return self._text(out)
        if state is _State.CONTENT:
            out.append(Content(self._gap.text(self._buf)))
            self._buf = ""
            return False
        if state is _State.CALL:
            return self._step_call(out)
        if state in (_State.NAME, _State.CALL_ID):
            return self._v11(out)
        body = self._buf.lstrip(WHITESPACE)
        self._keep(self._buf[: len(self._buf) - len(body)])
        self._buf = body
        if not body:
            return False
        if state is _State.OPEN and body[0] == "[":
            self._keep("[")
            self._buf, self._in_array, self._state = body[1:], True, _State.ELEMENT
        elif state in (_State.OPEN, _State.ELEMENT) and body[0] == "{":
            self._state, self._call, self._shown = _State.CALL, CallObject(), False
        elif state is _State.OPEN:
            self._state, self._name = _State.NAME, ""
        elif state is _State.NEXT and body[0] in ",]":
            self._keep(body[0])
            self._buf = body[1:]
            self._state = _State.ELEMENT if body[0] == "," else _State.TEXT
        elif state is _State.ELEMENT and body[0] == "]":
            self._keep("]")
            self._buf, self._state = body[1:], _State.TEXT
        else:
            self._break()
        return True

    def _text(self, out: list[ToolPiece]) -> bool:
        hit = find_marker(self._buf, (MARKER,))
        if hit is None:
            shown, self._buf = split_certain(self._buf, (MARKER,))
            out.append(Content(self._gap.text(shown)))
            return False
        out.append(Content(self._gap.text(self._buf[: hit[0]])))
        self._buf = self._buf[hit[0] + len(MARKER) :]
        self._held, self._in_array, self._state = MARKER, False, _State.OPEN
        self._shown = False
        return True

    def _v11(self, out: list[ToolPiece]) -> bool:
        """``<fn>[CALL_ID]<id>[ARGS]{…}``: read up to the arguments object."""
        if self._state is _State.NAME:
            run = _NAME.match(self._buf)
            assert run is not None
            self._name += run.group()
            self._keep(run.group())
            self._buf = self._buf[run.end() :]
        else:  # the call id: anything up to [ARGS] or "{"
            found = (self._buf.find("["), self._buf.find("{"))
            stop = min((i for i in found if i >= 0), default=-1)
            taken = self._buf if stop < 0 else self._buf[:stop]
            self._keep(taken)
            self._buf = self._buf[len(taken) :]
        if not self._buf:
            return False
        if self._buf[0] == "{" and self._name:
            return self._start_v11(out)
        for marker in (ARGS, CALL_ID):
            if self._buf.startswith(marker):
                self._keep(marker)
                self._buf = self._buf[len(marker) :]
                if marker == CALL_ID:
                    self._state = _State.CALL_ID
                    return True
                return self._start_v11(out) if self._name else self._break()
            if marker.startswith(self._buf):
                return False
        return self._break()

    def _start_v11(self, out: list[ToolPiece]) -> bool:
        self._state, self._call = _State.CALL, CallObject(bare=True)
        self._show(out, self._name)
        return True

    def _step_call(self, out: list[ToolPiece]) -> bool:
        call = self._call
        assert call is not None
        end = call.feed(self._buf)
        self._buf = self._buf[end:]
        if not self._shown and call.ready and call.name is not None:
            self._show(out, call.name)
        if self._shown:
            out.append(ToolCallArgs(self._index, call.take()))
        if call.status is Status.RUNNING:
            return False
        self._call = None
        if not self._shown:
            self._keep(call.raw)
            return self._break()
        finished = call.status is Status.DONE or call.args_done
        out.append(ToolCallArgs(self._index, call.close()))
        self._gap.call_ends()
        if not finished:
            self._state = _State.CONTENT
        else:
            self._state = _State.NEXT if self._in_array else _State.TEXT
        return True

    def _show(self, out: list[ToolPiece], name: str) -> None:
        self._index += 1
        out.append(ToolCallStart(self._index, self._ids(), name))
        self._gap.call_starts()
        self._shown, self._held = True, ""

    def _keep(self, text: str) -> None:
        """Consumed syntax: kept while no call is shown, to give back if it breaks."""
        if not self._shown:
            self._held += text

    def _break(self) -> bool:
        """The syntax broke: what was held and the rest of the answer are content."""
        self._buf, self._held = self._held + self._buf, ""
        self._state = _State.CONTENT
        return True
