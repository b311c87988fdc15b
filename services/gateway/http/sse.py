"""Pure: the SSE bytes the gateway writes itself (the formatter frames all the others): the
keep-alive comment an idle stream gets (``--sse-keep-alive-s``), and the error event below.

A stream that fails after its headers went out ends with an error event in the dialect of its
API: OpenAI chat and completions ``data: {"error": …}`` then ``data: [DONE]``; Anthropic
``event: error`` with ``{"type": "error", "error": {"type", "message"}}`` (and nothing after it,
as Anthropic); the Responses API ``event: error`` with ``{"type": "error", "code", "message",
"param", "sequence_number"}`` (its streams have no ``[DONE]``).
"""

from __future__ import annotations

import re

import msgspec

from shared import sse
from shared.errors import ServiceError

KEEP_ALIVE = b": keep-alive\n\n"
"""An SSE comment line: clients ignore it (the SSE standard), proxies see bytes flow."""
_SEQUENCE = re.compile(rb'"sequence_number":(\d+)')


def error_frame(exc: ServiceError) -> bytes:
    """An OpenAI error object as one SSE event, for failures after the headers went out."""
    return sse.frame(exc.body())


def error_tail(exc: ServiceError) -> bytes:
    """What ends a stream that failed midway: the error event, then ``[DONE]``."""
    return error_frame(exc) + sse.DONE


def anthropic_error_tail(error_type: str, message: str) -> bytes:
    """Anthropic's in-stream error event."""
    error = {"type": error_type, "message": message}
    return sse.event("error", msgspec.json.encode({"type": "error", "error": error}))


def responses_error_tail(exc: ServiceError, sent: bytes) -> bytes:
    """The Responses API's in-stream ``error`` event, numbered after the last event in
    ``sent`` (the bytes of the last chunk relayed)."""
    numbers = _SEQUENCE.findall(sent)
    sequence = int(numbers[-1]) + 1 if numbers else 0
    payload = {
        "type": "error",
        "code": exc.code,
        "message": exc.message,
        "param": exc.param,
        "sequence_number": sequence,
    }
    return sse.event("error", msgspec.json.encode(payload))
