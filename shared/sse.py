"""Server-sent-events framing, the one place it is written. Pure.

The formatter frames every chunk and event; the gateway frames only the error event that ends a
stream which failed after its headers went out.
"""

from __future__ import annotations

PREFIX = b"data: "
END = b"\n\n"
DONE = PREFIX + b"[DONE]" + END
"""The OpenAI stream terminator."""


def frame(payload: bytes) -> bytes:
    """One ``data:`` event carrying ``payload`` (a JSON document)."""
    return PREFIX + payload + END


def event(name: str, payload: bytes) -> bytes:
    """One named event: ``event: <name>`` then its ``data:`` line (Anthropic's and the Responses
    API's streams, and their error events)."""
    return b"event: " + name.encode() + b"\n" + frame(payload)


def annotation(name: str, payload: str) -> bytes:
    """An out-of-band ``event:`` frame with ``payload`` (one JSON line) as a comment, as Dynamo
    answers ``nvext.annotations``: SSE clients that do not look for it never see it (an event
    with no ``data`` is not dispatched)."""
    return b"event: " + name.encode() + b"\n: " + payload.encode() + END
