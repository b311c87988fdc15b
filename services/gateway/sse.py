"""Pure: the one SSE event the gateway writes itself (the formatter frames all the others)."""

from __future__ import annotations

from shared import sse
from shared.errors import ServiceError


def error_frame(exc: ServiceError) -> bytes:
    """An OpenAI error object as one SSE event, for failures after the headers went out."""
    return sse.frame(exc.body())


def error_tail(exc: ServiceError) -> bytes:
    """What ends a stream that failed midway: the error event, then ``[DONE]``."""
    return error_frame(exc) + sse.DONE
