"""The OpenResponses schema (``tests/data/openresponses/response.schema.json``): a ``response``
object and each streamed event checked as a client that validates against the schema checks it.

Every function returns the violations as readable lines (empty = valid), so a failing assert
shows all of them at once.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "data/openresponses/response.schema.json"
RESPONSE = "ResponseResource"
EVENTS: dict[str, str] = {
    "response.created": "ResponseCreatedStreamingEvent",
    "response.queued": "ResponseQueuedStreamingEvent",
    "response.in_progress": "ResponseInProgressStreamingEvent",
    "response.completed": "ResponseCompletedStreamingEvent",
    "response.failed": "ResponseFailedStreamingEvent",
    "response.incomplete": "ResponseIncompleteStreamingEvent",
    "response.output_item.added": "ResponseOutputItemAddedStreamingEvent",
    "response.output_item.done": "ResponseOutputItemDoneStreamingEvent",
    "response.content_part.added": "ResponseContentPartAddedStreamingEvent",
    "response.content_part.done": "ResponseContentPartDoneStreamingEvent",
    "response.output_text.delta": "ResponseOutputTextDeltaStreamingEvent",
    "response.output_text.done": "ResponseOutputTextDoneStreamingEvent",
    "response.reasoning.delta": "ResponseReasoningDeltaStreamingEvent",
    "response.reasoning.done": "ResponseReasoningDoneStreamingEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaStreamingEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneStreamingEvent",
    "error": "ErrorStreamingEvent",
}
"""Streamed event ``type`` -> its schema (the events a Responses endpoint without hosted tools
sends, as OpenResponses names them)."""
WITH_RESPONSE = frozenset(
    {
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.failed",
        "response.incomplete",
    }
)
"""The events that carry a whole ``response`` object."""


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    defs = json.loads(SCHEMA_PATH.read_text())["$defs"]
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": defs})


def _errors(name: str, instance: Any) -> list[str]:
    found = _validator(name).iter_errors(instance)
    return sorted(f"{name} at /{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in found)


def missing_required(response: dict[str, Any]) -> list[str]:
    """The fields the schema requires of a ``response`` object that ``response`` lacks."""
    required = json.loads(SCHEMA_PATH.read_text())["$defs"][RESPONSE]["required"]
    return [name for name in required if name not in response]


def response_errors(response: Any) -> list[str]:
    """Where a ``response`` object (a non-streamed body) breaks the schema."""
    return _errors(RESPONSE, response)


def event_errors(event: Any) -> list[str]:
    """Where one streamed event breaks the schema of its ``type`` (an unknown type is one)."""
    kind = event.get("type") if isinstance(event, dict) else None
    name = EVENTS.get(kind) if isinstance(kind, str) else None
    if name is None:
        return [f"event type {kind!r} is not an OpenResponses streaming event"]
    return _errors(name, event)
