"""Pure: the few SSE frames the gateway writes itself (the formatter writes all the others)."""

from __future__ import annotations

from shared.errors import ServiceError

DONE = b"data: [DONE]\n\n"


def error_frame(exc: ServiceError) -> bytes:
    """An OpenAI error object as one SSE event, for failures after the headers went out."""
    return b"data: " + exc.body() + b"\n\n"


def error_tail(exc: ServiceError) -> bytes:
    """What ends a stream that failed midway: the error event, then ``[DONE]``."""
    return error_frame(exc) + DONE
