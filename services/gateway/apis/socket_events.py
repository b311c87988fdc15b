"""Pure: the Responses API's WebSocket mode (decision 030) on the wire: client events in,
server events out.

A client sends ``response.create`` events: the ``POST /v1/responses`` body with a ``type``, and
without ``stream`` (every turn streams) or ``background`` (refused, as OpenAI does). The server
answers each with the events an SSE stream of the same request carries, one JSON text message
each (``server_events``), and failures as ``{"type": "error", "status", "error": {"type",
"code", "message", "param"}}`` (``error_event``; with the ``sequence_number`` after the last
event when the response had started).
"""

from __future__ import annotations

from typing import Any

import msgspec

from shared import sse
from shared.errors import InvalidRequest, ServiceError

CREATE = "response.create"


def create_body(message: str | bytes) -> bytes:
    """A ``response.create`` event as the ``POST /v1/responses`` body it stands for (streaming);
    400 for anything else."""
    try:
        event = msgspec.json.decode(message)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"The event is not valid JSON: {exc}") from None
    if not isinstance(event, dict):
        raise InvalidRequest("An event is a JSON object with a `type`.", param="type")
    kind = event.pop("type", None)
    if kind != CREATE:
        raise InvalidRequest(
            f"Unsupported event type `{kind}`: this WebSocket takes `{CREATE}` events.",
            param="type",
        )
    if event.pop("generate", True) is not True:
        raise InvalidRequest(
            "`generate: false` (warm-up) is not supported here: send the turn itself.",
            param="generate",
        )
    if event.get("background"):
        raise InvalidRequest("`background` is not supported over WebSocket.", param="background")
    event.pop("stream", None)
    event.pop("stream_options", None)
    event["stream"] = True
    return msgspec.json.encode(event)


def server_events(data: bytes) -> list[bytes]:
    """The JSON payload of every SSE event in ``data`` (keep-alive comments dropped)."""
    return [
        line[len(sse.PREFIX) :]
        for frame in data.split(sse.END)
        for line in frame.split(b"\n")
        if line.startswith(sse.PREFIX)
    ]


def error_event(exc: ServiceError, sequence_number: int | None = None) -> bytes:
    """A failure as the WebSocket ``error`` event."""
    event: dict[str, Any] = {
        "type": "error",
        "status": exc.status,
        "error": {
            "type": exc.type,
            "code": exc.code,
            "message": exc.message,
            "param": exc.param,
        },
    }
    if sequence_number is not None:
        event["sequence_number"] = sequence_number
    return msgspec.json.encode(event)


def next_sequence(sent: bytes) -> int | None:
    """The ``sequence_number`` after the last event in ``sent`` (``None`` if it has none)."""
    try:
        event = msgspec.json.decode(sent)
    except msgspec.DecodeError:
        return None
    number = event.get("sequence_number") if isinstance(event, dict) else None
    return number + 1 if isinstance(number, int) else None
