"""Pure: request bytes -> a validated Struct, for every HTTP front end (OpenAI, Anthropic,
Responses, embeddings).

A strict decode refuses unknown
top-level fields (a 400 naming them) unless ``allow_unknown`` (``--allow-unknown-fields``), then
a lenient one ignores them; msgspec's error path (``$.messages[0].role``) becomes the error's
``param`` (``messages[0].role``). Nested objects ignore unknown keys.
"""

from __future__ import annotations

import re
from typing import Any, Generic, TypeVar

import msgspec
import structlog

from shared.errors import InvalidRequest

log = structlog.get_logger(__name__)

_AT_PATH = re.compile(r"^(?P<detail>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_UNKNOWN = "Object contains unknown field"

S = TypeVar("S", bound=msgspec.Struct)


class UnknownField(InvalidRequest):
    """A top-level field the request type does not define (400; ``param`` is the field)."""

    code = "unknown_parameter"


class Decoders(Generic[S]):
    """One request type's strict and lenient JSON decoders and its top-level field names."""

    __slots__ = ("known", "lenient", "strict", "what")

    def __init__(self, strict: type[S], lenient: type[S], what: str) -> None:
        self.strict = msgspec.json.Decoder(strict)
        self.lenient = msgspec.json.Decoder(lenient)
        self.known = frozenset(f.encode_name for f in msgspec.structs.fields(lenient))
        self.what = what

    def decode(self, body: bytes, *, allow_unknown: bool = False) -> S:
        """The body as ``S``; every way it can be wrong is an ``InvalidRequest``."""
        try:
            return self.strict.decode(body)
        except msgspec.ValidationError as exc:
            error = str(exc)
            if not error.startswith(_UNKNOWN):
                raise invalid(error) from None
        except msgspec.DecodeError as exc:
            raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
        unknown = self._unknown_fields(body)
        if not allow_unknown:
            shown = ", ".join(f"`{name}`" for name in unknown)
            noun = "field" if len(unknown) == 1 else "fields"
            raise UnknownField(
                f"Unrecognized request {noun} {shown}: not part of the {self.what}. "
                "(The server can be started with --allow-unknown-fields to ignore such fields.)",
                param=unknown[0],
            )
        log.info("unknown_fields_ignored", fields=unknown)
        try:
            return self.lenient.decode(body)
        except msgspec.ValidationError as exc:
            raise invalid(str(exc)) from None

    def _unknown_fields(self, body: bytes) -> list[str]:
        fields: Any = msgspec.json.decode(body)
        names = fields.keys() if isinstance(fields, dict) else ()
        return [name for name in names if name not in self.known] or ["?"]


def invalid(error: str, prefix: str = "") -> InvalidRequest:
    """msgspec's ``"<detail> - at `$.a[0].b`"`` as a message and a ``param`` (``prefix``: where
    the decoded value sits in the body, e.g. ``input[2]``)."""
    match = _AT_PATH.match(error)
    detail = match["detail"] if match else error
    param = (match["path"] or "").lstrip(".") if match else ""
    param = param.replace("[...]", "")  # a dict value: name the dict (keys are not shown)
    if prefix:
        param = f"{prefix}.{param}" if param and not param.startswith("[") else prefix + param
    if missing := _MISSING.match(detail):
        param = f"{param}.{missing['field']}" if param else missing["field"]
    if not param:
        return InvalidRequest(f"Invalid request body: {detail}")
    return InvalidRequest(f"Invalid value for `{param}`: {detail}", param=param)
