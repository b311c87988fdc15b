"""Llama 3.x JSON tool calls. Pure.

The model answers with ``{"name": "<fn>", "parameters": {…}}`` (several separated by ``;``),
optionally after ``<|python_tag|>`` (which may also lead each further call); an answer that
starts with anything else is content. A call is shown once its name is known and its arguments
have begun to parse; they stream. Whatever follows the calls is content (only separators and
whitespace are dropped). A call broken before it is shown is given back as content with the rest
of the answer; one broken later has its arguments closed into valid JSON.
"""

from __future__ import annotations

from enum import Enum

from services.formatter.parsers._calls import CallObject, Status, closing_pieces
from services.formatter.parsers._json import WHITESPACE
from services.formatter.parsers._text import Gap, IdFactory, new_call_id
from services.formatter.pieces import Content, ToolCallArgs, ToolCallStart, ToolPiece, tidy

PYTHON_TAG = "<|python_tag|>"


class _State(Enum):
    START = 0  # nothing decided yet
    BETWEEN = 1  # before a call: whitespace and ";" are skipped
    CALL = 2
    CONTENT = 3  # the rest of the answer is content


class Llama3JsonParser:
    """JSON tool calls at the start of the answer."""

    def __init__(self, *, ids: IdFactory = new_call_id) -> None:
        self._ids = ids
        self._state = _State.START
        self._buf = ""
        self._held = ""
        """Text consumed while no call was shown yet: content if no call comes."""
        self._gap = Gap()
        self._call: CallObject | None = None
        self._shown = False
        self._index = -1

    def push(self, text: str) -> list[ToolPiece]:
        out: list[ToolPiece] = []
        self._buf += text
        while self._buf and self._step(out):
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
        if self._state is _State.CONTENT:
            out.append(Content(self._gap.text(self._buf)))
            self._buf = ""
            return False
        if self._state is _State.START:
            return self._start()
        if self._state is _State.BETWEEN:
            return self._between(out)
        return self._step_call(out)

    def _start(self) -> bool:
        body = self._buf.lstrip(WHITESPACE)
        lead = self._buf[: len(self._buf) - len(body)]
        if body.startswith(PYTHON_TAG):
            self._held += lead + PYTHON_TAG
            self._buf = body[len(PYTHON_TAG) :]
            self._state = _State.BETWEEN
        elif body.startswith("{"):
            self._held += lead
            self._buf = body
            self._state = _State.BETWEEN
        elif not body or PYTHON_TAG.startswith(body):
            return False
        else:
            self._buf, self._held = self._held + self._buf, ""
            self._state = _State.CONTENT
        return True

    def _between(self, out: list[ToolPiece]) -> bool:
        seps = WHITESPACE + (";" if self._index >= 0 else "")
        body = self._buf.lstrip(seps)
        if self._index < 0:
            self._held += self._buf[: len(self._buf) - len(body)]
        self._buf = body
        if not body:
            return False
        if self._index >= 0 and PYTHON_TAG.startswith(body[: len(PYTHON_TAG)]):
            if len(body) < len(PYTHON_TAG):
                return False  # may be another <|python_tag|>: wait
            self._buf = body[len(PYTHON_TAG) :]  # calls may each carry the tag
            return True
        if body[0] == "{":
            self._state, self._call, self._shown = _State.CALL, CallObject(require_args=True), False
        else:
            self._buf, self._held = self._held + body, ""
            self._state = _State.CONTENT
        return True

    def _step_call(self, out: list[ToolPiece]) -> bool:
        call = self._call
        assert call is not None
        end = call.feed(self._buf)
        self._buf = self._buf[end:]
        if not self._shown and call.ready and call.name is not None:
            self._index += 1
            out.append(ToolCallStart(self._index, self._ids(), call.name))
            self._gap.call_starts()
            self._shown, self._held = True, ""
        if self._shown:
            out.append(ToolCallArgs(self._index, call.take()))
        if call.status is Status.RUNNING:
            return False
        self._call = None
        if not self._shown:  # not a call: the rest of the answer is content
            self._buf, self._held = self._held + call.raw + self._buf, ""
            self._state = _State.CONTENT
            return True
        finished = call.status is Status.DONE or call.args_done
        out.append(ToolCallArgs(self._index, call.close()))
        self._gap.call_ends()
        self._state = _State.BETWEEN if finished else _State.CONTENT
        return True
