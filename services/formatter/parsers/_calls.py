"""One tool call written as a JSON object, read incrementally: ``{"name": …, "arguments": {…}}``
(``parameters`` is read as ``arguments``), or with ``bare`` just the arguments object. Pure.

The name is known once its string closes; the arguments text is released as it becomes safe
(see ``_json``), so a caller can show ``ToolCallStart`` early and stream the arguments. Arguments
written as a JSON-encoded string, or ``null``, are accepted once whole.
"""

from __future__ import annotations

import json
import re
from enum import Enum

from services.formatter.parsers._json import (
    COLON,
    DONE,
    OBJ_NEXT,
    STRING,
    VALUE,
    WHITESPACE,
    JsonScanner,
    escape_control,
)
from services.formatter.parsers._text import Gap
from services.formatter.pieces import Content, ToolCallArgs, ToolPiece, tidy

_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')
ARG_KEYS = ("arguments", "parameters")


class Status(Enum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class _Mode(Enum):
    SKIP = 0  # a member we do not need
    NAME = 1
    STREAM = 2  # arguments as an object: streamed
    BUFFER = 3  # arguments as a string or null: read whole


class CallObject:
    """Reads one call object; ``feed`` it text, ``take`` the arguments text that is certain."""

    __slots__ = (
        "_args",
        "_args_seen",
        "_bare",
        "_base",
        "_key",
        "_key_raw",
        "_mode",
        "_progress",
        "_raw",
        "_require_args",
        "_safe",
        "_safe_in_string",
        "_scan",
        "_stream",
        "_taken",
        "_value",
        "args_done",
        "name",
        "status",
    )

    def __init__(self, *, bare: bool = False, require_args: bool = False) -> None:
        self._scan = JsonScanner()
        self._bare = bare
        self._require_args = require_args
        """An object without an arguments member is not a call (syntaxes with no markers)."""
        self._base = 0 if bare else 1
        self.status = Status.RUNNING
        self.name: str | None = None
        self.args_done = False
        self._raw: list[str] = []
        self._key: str | None = None
        self._key_raw = ""
        self._mode: _Mode | None = None
        """What the member value being read is for; ``None`` between members."""
        self._value: list[str] = []
        self._args: list[str] = []
        self._args_seen = False
        self._stream = False
        """The arguments are an object, streamed as they come."""
        self._progress = False
        self._safe = 0
        self._safe_in_string = False
        self._taken = 0

    @property
    def ready(self) -> bool:
        """Whether the call can be shown: its name is known and its arguments have begun to
        parse (past the opening brace), are whole, or are absent from a whole object. A call
        that breaks before this is given back as text."""
        if self.name is None:
            return False
        whole = self.status is Status.DONE and (self._args_seen or not self._require_args)
        return self._progress or self.args_done or whole

    @property
    def raw(self) -> str:
        """The text consumed so far."""
        return "".join(self._raw)

    def feed(self, text: str, i: int = 0) -> int:
        """Consume ``text`` from ``i``; return where it stopped: the end of ``text``, just after
        the object's closing brace (``DONE``), or at the character that broke it (``FAILED``)."""
        start, scan = i, self._scan
        while i < len(text) and self.status is Status.RUNNING:
            if scan.state == STRING and (run := _PLAIN.match(text, i)):
                self._plain(run.group())
                i = run.end()
            elif self._step(text[i]):
                i += 1
            else:
                self.status = Status.FAILED
        self._raw.append(text[start:i])
        return i

    def take(self) -> str:
        """The arguments text that became certain since the last call."""
        if self._taken < 0:
            return ""
        if self.status is Status.DONE and not self._args_seen:
            self._taken = -1  # no arguments member: the call has none
            return "{}"
        text = "".join(self._args[self._taken : self._safe])
        self._taken = max(self._taken, self._safe)
        return text

    def close(self) -> str:
        """What is left to show of the arguments, repaired into a whole JSON object when the
        call ended early: an open string value gets its quote, open containers their closers."""
        if self._taken < 0:
            return ""
        rest = "".join(self._args[self._taken : self._safe])
        if self.args_done:
            out = rest
        elif self._stream:
            quote = '"' if self._safe_in_string else ""
            out = rest + quote + self._scan.closers(self._base)
        else:  # no arguments yet, or a string-encoded one cut short
            out = "{}"
        self._taken = -1
        return out

    # --- one character ----------------------------------------------------------------------

    def _plain(self, run: str) -> None:
        """A run of ordinary characters inside a string: no state change."""
        scan = self._scan
        if self._bare or self._mode is _Mode.STREAM:
            self._args.append(run)
            if not scan.is_key:
                self._safe, self._safe_in_string = len(self._args), True
                self._progress = True
        elif self._mode in (_Mode.NAME, _Mode.BUFFER):
            self._value.append(run)
        elif self._mode is None and scan.depth == 1:
            self._key_raw += run

    def _step(self, ch: str) -> bool:
        scan = self._scan
        depth, state = scan.depth, scan.state
        at_start = depth == 0 and state == VALUE
        if at_start and ch not in WHITESPACE and ch != "{":
            return False
        was_string = state == STRING
        if not scan.feed(ch):
            return False
        if self._bare:
            if not at_start or ch not in WHITESPACE:
                self._args_seen = self._stream = True
                self._args_char(ch, was_string)
            return True
        if depth == 1 and state == VALUE and ch not in WHITESPACE:
            self._begin_value(ch)
        if self._mode is not None:
            if scan.number_ended and depth == 1:
                if not self._end_value():
                    return False
            else:
                if self._mode is _Mode.STREAM:
                    self._args_char(ch, was_string)
                elif self._mode is not _Mode.SKIP:
                    self._value.append(ch)
                if scan.depth == 1 and scan.state == OBJ_NEXT and not self._end_value():
                    return False
        elif scan.depth == 1 and scan.is_key and (scan.in_string or was_string):
            self._key_raw += ch
            if scan.state == COLON:
                self._key, self._key_raw = json.loads(self._key_raw, strict=False), ""
        if scan.state == DONE:
            return self._finish()
        return True

    def _args_char(self, ch: str, was_string: bool) -> None:
        """Add one character of the arguments (already fed to the scanner)."""
        scan = self._scan
        self._args.append(escape_control(ch) if was_string and ch < " " else ch)
        if scan.safe:
            self._safe, self._safe_in_string = len(self._args), scan.state == STRING
            if len(self._args) > 1 and ch not in WHITESPACE:
                self._progress = True
        if self._bare and scan.state == DONE:
            self.args_done = True
            self.status = Status.DONE

    def _begin_value(self, ch: str) -> None:
        key = self._key
        if key in ARG_KEYS and not self._args_seen:
            self._args_seen = True
            self._stream = ch == "{"
            self._mode = _Mode.STREAM if self._stream else _Mode.BUFFER
        else:
            self._mode = _Mode.NAME if key == "name" and self.name is None else _Mode.SKIP
        self._value = []

    def _end_value(self) -> bool:
        """A member's value is whole: keep what it says. ``False`` when it breaks the call."""
        mode, self._mode = self._mode, None
        if mode is _Mode.STREAM:
            self.args_done = True
            self._safe = len(self._args)
            return True
        if mode is _Mode.SKIP:
            return True
        value = json.loads("".join(self._value), strict=False)
        if mode is _Mode.NAME:
            if not isinstance(value, str) or not value:
                return False
            self.name = value
            return True
        return self._buffered_args(value)

    def _buffered_args(self, value: object) -> bool:
        if value is None:
            text = "{}"
        elif isinstance(value, str):
            try:
                parsed = json.loads(value)
            except ValueError:
                return False
            if not isinstance(parsed, dict):
                return False
            text = value
        else:
            return False
        self._args = [text]
        self._safe, self.args_done = 1, True
        return True

    def _finish(self) -> bool:
        if self.name is None or (self._require_args and not self._args_seen):
            return False
        self.status = Status.DONE
        return True


def closing_pieces(
    gap: Gap, call: CallObject | None, *, shown: bool, index: int, text: str | None
) -> list[ToolPiece]:
    """A parser's ``flush``: a call whose start was shown is closed into valid JSON; otherwise
    ``text`` (what was held back, an unshown call's raw text included; ``None``: nothing) is
    content after all. Then the whitespace the gap held."""
    out: list[ToolPiece] = []
    if call is not None and shown:
        out.append(ToolCallArgs(index, call.close()))
    elif text is not None:
        out.append(Content(gap.text(text)))
    out.append(Content(gap.flush()))
    return tidy(out)
