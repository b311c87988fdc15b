"""Qwen3-Coder XML tool calls. Pure.

``<tool_call>\\n<function=<fn>>\\n<parameter=<p>>\\n<value>\\n</parameter>\\n…</function>\\n
</tool_call>`` per call (a bare ``<function=…>`` block is read too). Values are raw text, typed by
the tool's JSON schema (``_schema``); one newline on each side of a value is layout. Arguments
stream as ``{"p1": v1``, ``, "p2": v2``, ``}``; a string value streams as it is written. A call
broken before its name is content; one broken later gets its arguments closed, the rest of its
block dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from services.formatter.parsers._json import WHITESPACE
from services.formatter.parsers._schema import Types, is_text, parameter_types, typed_value
from services.formatter.parsers._text import (
    Gap,
    IdFactory,
    find_marker,
    new_call_id,
    partial_tail,
    split_certain,
)
from services.formatter.pieces import Content, ToolCallArgs, ToolCallStart, ToolPiece, tidy

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
_VALUE_ENDS = (PARAMETER_END, PARAMETER, FUNCTION_END)
_BODY = (PARAMETER, FUNCTION_END, CLOSE)
_MAX_NAME = 256


class _State(Enum):
    TEXT = 0
    OPENED = 1  # after <tool_call>: <function= expected
    NAME = 2  # function name, up to ">"
    BODY = 3  # <parameter=…>, </function> expected
    PARAM = 4  # parameter name, up to ">"
    VALUE = 5
    AFTER = 6  # after </function>: </tool_call> expected
    DROP = 7  # the rest of a broken, shown call's block is dropped
    SHOW = 8  # a call broken before its name: content up to </tool_call>


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


class Qwen3CoderParser:
    """``<tool_call><function=…>`` blocks in answer text, typed by ``tools``' schemas."""

    def __init__(
        self, *, tools: Sequence[Mapping[str, Any]] = (), ids: IdFactory = new_call_id
    ) -> None:
        self._types = parameter_types(tools)
        self._ids = ids
        self._state = _State.TEXT
        self._buf = ""
        self._held = ""
        """Raw text of the call while its name is unknown: content if it breaks."""
        self._gap = Gap()
        self._wrapped = False
        self._index = -1
        self._params: dict[str, Types] = {}
        self._count = 0  # parameters written so far
        self._param = ""
        self._param_types: Types = frozenset()
        self._value: list[str] = []
        self._lead = True  # the value's leading newline is still to be looked for

    def push(self, text: str) -> list[ToolPiece]:
        out: list[ToolPiece] = []
        self._buf += text
        while self._buf and self._step(out):
            pass
        return tidy(out)

    def flush(self) -> list[ToolPiece]:
        out: list[ToolPiece] = []
        state = self._state
        if state in (_State.TEXT, _State.SHOW):
            out.append(Content(self._gap.text(self._buf)))
        elif state in (_State.OPENED, _State.NAME):
            out.append(Content(self._gap.text(self._held + self._buf)))
        elif state is _State.VALUE:
            text = self._buf[1:] if self._lead and self._buf.startswith("\n") else self._buf
            self._end_value(out, text, closing=False)
            out.append(ToolCallArgs(self._index, self._closer()))
        elif state in (_State.BODY, _State.PARAM):
            out.append(ToolCallArgs(self._index, self._closer()))
        out.append(Content(self._gap.flush()))
        self._buf, self._state = "", _State.TEXT
        return tidy(out)

    def _step(self, out: list[ToolPiece]) -> bool:
        """Advance on the buffer; ``False`` when more text is needed."""
        state = self._state
        if state is _State.TEXT:
            return self._text(out)
        if state is _State.VALUE:
            return self._value_text(out)
        if state in (_State.NAME, _State.PARAM):
            return self._name(out)
        if state in (_State.DROP, _State.SHOW):
            return self._skip(out)
        body = self._buf.lstrip(WHITESPACE)
        if state is _State.OPENED:
            self._held += self._buf[: len(self._buf) - len(body)]
        self._buf = body
        if not body:
            return False
        options = {
            _State.OPENED: (FUNCTION,),
            _State.BODY: _BODY,
            _State.AFTER: (CLOSE,),
        }[state]
        for marker in options:
            if body.startswith(marker):
                self._buf = body[len(marker) :]
                return self._marker(out, marker)
            if marker.startswith(body):
                return False
        if state is _State.AFTER:  # no </tool_call>: the call is over anyway
            self._end_call()
            return True
        return self._break(out)

    def _marker(self, out: list[ToolPiece], marker: str) -> bool:
        if marker == FUNCTION:
            self._held += FUNCTION
            self._state = _State.NAME
        elif marker == PARAMETER:
            self._state = _State.PARAM
        elif self._state is _State.AFTER:  # </tool_call>
            self._end_call()
        else:  # </function>, or </tool_call> with no </function>
            out.append(ToolCallArgs(self._index, self._closer()))
            if marker == FUNCTION_END and self._wrapped:
                self._state = _State.AFTER
            else:
                self._end_call()
        return True

    def _text(self, out: list[ToolPiece]) -> bool:
        hit = find_marker(self._buf, (OPEN, FUNCTION))
        if hit is None:
            shown, self._buf = split_certain(self._buf, (OPEN, FUNCTION))
            out.append(Content(self._gap.text(shown)))
            return False
        at, marker = hit
        out.append(Content(self._gap.text(self._buf[:at])))
        self._buf = self._buf[at + len(marker) :]
        self._held, self._wrapped = marker, marker == OPEN
        self._state = _State.OPENED if self._wrapped else _State.NAME
        return True

    def _name(self, out: list[ToolPiece]) -> bool:
        """A function or parameter name, up to ``>``."""
        end = self._buf.find(">")
        name = self._buf if end < 0 else self._buf[:end]
        if "<" in name or "\n" in name or len(name) > _MAX_NAME or (end >= 0 and not name.strip()):
            return self._break(out)
        if end < 0:
            return False
        if self._state is _State.NAME:
            self._held += self._buf[: end + 1]
        self._buf = self._buf[end + 1 :]
        name = name.strip()
        if self._state is _State.NAME:
            self._index += 1
            out.append(ToolCallStart(self._index, self._ids(), name))
            self._gap.call_starts()
            self._params, self._count, self._held = self._types.get(name, {}), 0, ""
            self._state = _State.BODY
        else:
            self._param, self._param_types = name, self._params.get(name, frozenset())
            self._value, self._lead, self._state = [], True, _State.VALUE
            if is_text(self._param_types):
                out.append(ToolCallArgs(self._index, self._key() + '"'))
        return True

    def _value_text(self, out: list[ToolPiece]) -> bool:
        if self._lead:
            self._lead = False
            if self._buf.startswith("\n"):
                self._buf = self._buf[1:]
                if not self._buf:
                    return False
        hit = find_marker(self._buf, _VALUE_ENDS)
        if hit is not None:
            at, marker = hit
            text = self._buf[:at]
            self._buf = self._buf[at + len(marker) :] if marker == PARAMETER_END else self._buf[at:]
            self._end_value(out, text[:-1] if text.endswith("\n") else text, closing=True)
            self._state = _State.BODY
            return True
        certain, tail = split_certain(self._buf, _VALUE_ENDS)
        if certain.endswith("\n"):  # may be the layout newline before </parameter>
            certain, tail = certain[:-1], "\n" + tail
        self._buf = tail
        if is_text(self._param_types):
            out.append(ToolCallArgs(self._index, _escaped(certain)))
        else:
            self._value.append(certain)
        return False

    def _end_value(self, out: list[ToolPiece], text: str, *, closing: bool) -> None:
        if not closing and text.endswith("\n"):
            text = text[:-1]
        if is_text(self._param_types):
            out.append(ToolCallArgs(self._index, _escaped(text) + '"'))
            return
        value = typed_value("".join(self._value) + text, self._param_types)
        out.append(ToolCallArgs(self._index, self._key() + json.dumps(value, ensure_ascii=False)))

    def _key(self) -> str:
        """``{"p": `` for the first parameter, ``, "p": `` for the next ones."""
        self._count += 1
        lead = "{" if self._count == 1 else ", "
        return lead + json.dumps(self._param, ensure_ascii=False) + ": "

    def _closer(self) -> str:
        return "}" if self._count else "{}"

    def _break(self, out: list[ToolPiece]) -> bool:
        if self._state in (_State.OPENED, _State.NAME):  # not shown yet: give it back
            out.append(Content(self._gap.text(self._held)))
            self._state = _State.SHOW if self._wrapped else _State.TEXT
            return True
        if self._state is _State.VALUE:
            self._end_value(out, "", closing=True)
        out.append(ToolCallArgs(self._index, self._closer()))
        self._state = _State.DROP if self._wrapped else _State.TEXT
        if not self._wrapped:
            self._gap.call_ends()
        return True

    def _skip(self, out: list[ToolPiece]) -> bool:
        """Up to the end of the block: dropped (``DROP``) or shown (``SHOW``)."""
        show = self._state is _State.SHOW
        hit = find_marker(self._buf, (CLOSE, OPEN))
        if hit is None:
            held = partial_tail(self._buf, (CLOSE, OPEN))
            if show:
                out.append(Content(self._buf[: len(self._buf) - held]))
            self._buf = self._buf[len(self._buf) - held :]
            return False
        at, marker = hit
        end = at + len(CLOSE) if marker == CLOSE else at
        if show:
            out.append(Content(self._buf[:end]))
            self._state = _State.TEXT
        else:
            self._end_call()
        self._buf = self._buf[end:]
        return True

    def _end_call(self) -> None:
        self._gap.call_ends()
        self._state = _State.TEXT
