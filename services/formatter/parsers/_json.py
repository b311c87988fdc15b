"""An incremental JSON scanner: validates a JSON value one character at a time, knows where it
ends (string escapes included) and when a prefix of it is safe to show. Pure.

A prefix is *safe* when it can be completed by closing what is open: an open string value gets
``"``, open objects and arrays get ``}`` / ``]``. Numbers, literals, escapes, keys and a pending
``,`` are held back until they are whole, so a cut stream can always be repaired into valid JSON.
"""

from __future__ import annotations

import re

WHITESPACE = " \t\n\r"

# Scanner states.
VALUE = 0  # a value is expected
OBJ_FIRST = 1  # after "{": a key or "}"
OBJ_KEY = 2  # after "," in an object: a key
COLON = 3  # after a key
OBJ_NEXT = 4  # after a member's value: "," or "}"
ARR_FIRST = 5  # after "[": a value or "]"
ARR_NEXT = 6  # after an element: "," or "]"
STRING = 7
ESCAPE = 8  # after a backslash in a string
UNICODE = 9  # inside \uXXXX
NUMBER = 10
LITERAL = 11  # true / false / null
DONE = 12

_SAFE = frozenset({OBJ_FIRST, ARR_FIRST, OBJ_NEXT, ARR_NEXT, DONE})
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_CHARS = frozenset("+-.eE0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_CLOSERS = {"{": "}", "[": "]"}


class JsonScanner:
    """Validates one JSON value character by character.

    Lenient in one way: raw control characters inside strings are accepted (models write raw
    newlines in code arguments); whoever shows the text escapes them.
    """

    __slots__ = ("_left", "_token", "is_key", "number_ended", "stack", "state")

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.state = VALUE
        self.is_key = False
        """Whether the string being read is an object key."""
        self.number_ended = False
        """The last ``feed`` ended a number: the number did not include that character."""
        self._token = ""
        self._left = 0

    @property
    def depth(self) -> int:
        return len(self.stack)

    @property
    def safe(self) -> bool:
        """Whether the text so far can be completed by closing what is open."""
        return self.state in _SAFE or (self.state == STRING and not self.is_key)

    @property
    def in_string(self) -> bool:
        return self.state in (STRING, ESCAPE, UNICODE)

    def closers(self, base: int = 0) -> str:
        """What closes the containers open above depth ``base``."""
        return "".join(_CLOSERS[c] for c in reversed(self.stack[base:]))

    def feed(self, ch: str) -> bool:
        """Consume one character; ``False`` when it cannot continue valid JSON (state kept)."""
        self.number_ended = False
        state = self.state
        if state == STRING:
            if ch == '"':
                if self.is_key:
                    self.state = COLON
                else:
                    self._after_value()
            elif ch == "\\":
                self.state = ESCAPE
            return True
        if state == ESCAPE:
            if ch in '"\\/bfnrt':
                self.state = STRING
            elif ch == "u":
                self.state, self._left = UNICODE, 4
            else:
                return False
            return True
        if state == UNICODE:
            if ch not in _HEX:
                return False
            self._left -= 1
            if not self._left:
                self.state = STRING
            return True
        if state == LITERAL:
            if ch != self._token[0]:
                return False
            self._token = self._token[1:]
            if not self._token:
                self._after_value()
            return True
        if state == NUMBER:
            if ch in _NUMBER_CHARS:
                self._token += ch
                return True
            if not _NUMBER.fullmatch(self._token):
                return False
            self._after_value()
            self.number_ended = True
        return self._structural(ch)

    def _structural(self, ch: str) -> bool:
        state = self.state
        if ch in WHITESPACE:
            return True
        if state == VALUE:
            return self._start_value(ch)
        if state == ARR_FIRST:
            return self._close("[") if ch == "]" else self._start_value(ch)
        if state in (OBJ_FIRST, OBJ_KEY):
            if ch == '"':
                self.state, self.is_key = STRING, True
                return True
            return state == OBJ_FIRST and ch == "}" and self._close("{")
        if state == COLON:
            if ch == ":":
                self.state = VALUE
                return True
            return False
        if state == OBJ_NEXT:
            if ch == ",":
                self.state = OBJ_KEY
                return True
            return ch == "}" and self._close("{")
        if state == ARR_NEXT:
            if ch == ",":
                self.state = VALUE
                return True
            return ch == "]" and self._close("[")
        return False  # DONE: nothing may follow but whitespace

    def _start_value(self, ch: str) -> bool:
        if ch in "{[":
            self.stack.append(ch)
            self.state = OBJ_FIRST if ch == "{" else ARR_FIRST
        elif ch == '"':
            self.state, self.is_key = STRING, False
        elif ch == "-" or (ch.isdigit() and ch.isascii()):
            self.state, self._token = NUMBER, ch
        elif ch in _LITERALS:
            self.state, self._token = LITERAL, _LITERALS[ch]
        else:
            return False
        return True

    def _close(self, opener: str) -> bool:
        if not self.stack or self.stack[-1] != opener:
            return False
        self.stack.pop()
        self._after_value()
        return True

    def _after_value(self) -> None:
        if not self.stack:
            self.state = DONE
        else:
            self.state = OBJ_NEXT if self.stack[-1] == "{" else ARR_NEXT


def escape_control(ch: str) -> str:
    """A raw control character as a JSON string escape."""
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}.get(
        ch, f"\\u{ord(ch):04x}"
    )
