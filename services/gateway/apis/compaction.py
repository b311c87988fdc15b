"""Pure: ``POST /v1/responses/compact`` (decision 030): the request, the summarizing turn the
served model runs, and the ``response.compaction`` object.

As OpenAI's reference has it, compacting a conversation (``input`` items, after the turns of
``previous_response_id`` when given) returns every user message, then one ``compaction`` item
that stands for everything else. Here the served model writes that item's content: a summary of
the conversation, asked for by one more user message (``SUMMARY_REQUEST``) under the request's
``instructions``. ``encrypted_content`` is the summary, encoded (``encode_summary``), not
encrypted: it is opaque to clients only by convention, and a client that edits it changes only
its own context. Given back as an input item, a compaction item becomes one user message
carrying the summary (``summary_message``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import msgspec

from services.gateway.apis.bodies import Decoders
from services.gateway.apis.stored_turns import check_response_id
from shared.errors import InvalidRequest

COMPACT_MAX_OUTPUT_TOKENS = 1024
"""The summary's token limit."""
CONTENT_PREFIX = "jetserve.compaction.v1."
SUMMARY_REQUEST = (
    "Summarize the conversation above for your own later use: it will replace everything but "
    "the user's messages. Keep the user's goals, what was done (tool calls and their results), "
    "decisions, facts learned, and what is left to do. Answer with the summary only."
)
SUMMARY_HEADER = "Summary of the earlier conversation (compacted):"


class CompactRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/responses/compact``."""

    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    # accepted, not acted on (as on /v1/responses)
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None
    image: dict[str, Any] | None = None


class StrictCompactRequest(CompactRequest, kw_only=True, forbid_unknown_fields=True):
    pass


_DECODERS: Decoders[CompactRequest] = Decoders(
    StrictCompactRequest, CompactRequest, "Responses compact request"
)


def parse_compact(body: bytes, *, allow_unknown: bool = False) -> CompactRequest:
    """Decode and check a ``/v1/responses/compact`` body (its items are checked when the
    summarizing turn is made)."""
    request = _DECODERS.decode(body, allow_unknown=allow_unknown)
    if not request.model:
        raise InvalidRequest("`model` must not be empty.", param="model")
    if request.previous_response_id is not None:
        check_response_id(request.previous_response_id, "previous_response_id")
    elif not request.input:
        raise InvalidRequest(
            "Nothing to compact: give `input` items, `previous_response_id`, or both.",
            param="input",
        )
    return request


def compacted_items(request: CompactRequest, history: Sequence[dict[str, Any]]) -> list[Any]:
    """The conversation to compact: the earlier turns' items (``history``), then ``input``."""
    items: list[dict[str, Any]] = list(history)
    if isinstance(request.input, str):
        items.append({"role": "user", "content": request.input})
    elif request.input:
        items += request.input
    return items


def summary_turn(request: CompactRequest, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The Responses request (as a body) that asks the model for the summary of ``items``
    (``compacted_items``): them, then ``SUMMARY_REQUEST``; nothing stored, no reasoning."""
    body: dict[str, Any] = {
        "model": request.model,
        "input": [*items, {"role": "user", "content": SUMMARY_REQUEST}],
        "max_output_tokens": COMPACT_MAX_OUTPUT_TOKENS,
        "reasoning": {"effort": "none"},
        "store": False,
    }
    if request.instructions is not None:
        body["instructions"] = request.instructions
    return body


def response_text(response: dict[str, Any]) -> str:
    """The text of a finished ``response``'s messages."""
    return "".join(
        part.get("text", "")
        for item in response.get("output") or ()
        if item.get("type") == "message"
        for part in item.get("content") or ()
        if part.get("type") == "output_text"
    )


def encode_summary(summary: str) -> str:
    """A compaction item's ``encrypted_content`` for ``summary``."""
    data = msgspec.json.encode({"summary": summary})
    return CONTENT_PREFIX + base64.urlsafe_b64encode(data).decode()


def decode_summary(content: str, param: str) -> str:
    """The summary in a compaction item's ``encrypted_content``; 400 naming ``param`` when
    this server did not write it."""
    payload = content.removeprefix(CONTENT_PREFIX)
    if payload != content:
        try:
            decoded = msgspec.json.decode(base64.urlsafe_b64decode(payload))
        except (binascii.Error, ValueError, msgspec.DecodeError):
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("summary"), str):
            return str(decoded["summary"])
    raise InvalidRequest(
        f"`{param}`: not a compaction item this server made (its `encrypted_content` came from "
        "another provider, or was changed).",
        param=param,
    )


def summary_message(summary: str) -> dict[str, Any]:
    """The chat message a compaction item stands for."""
    return {"role": "user", "content": f"{SUMMARY_HEADER}\n{summary}"}


def compacted_body(
    *,
    compaction_id: str,
    item_id: Any,
    created_at: int,
    items: Sequence[dict[str, Any]],
    summary: str,
    usage: dict[str, Any] | None,
) -> bytes:
    """The ``response.compaction`` object: every user message of ``items`` (the conversation
    compacted), then the compaction item. ``item_id(prefix)`` makes an item id."""
    output: list[dict[str, Any]] = []
    for item in items:
        if item.get("type", "message") != "message" or item.get("role") != "user":
            continue
        content = item.get("content")
        parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
        output.append(
            {
                "id": item.get("id") or item_id("msg"),
                "type": "message",
                "status": "completed",
                "role": "user",
                "content": parts,
            }
        )
    output.append(
        {"id": item_id("cmp"), "type": "compaction", "encrypted_content": encode_summary(summary)}
    )
    return msgspec.json.encode(
        {
            "id": compaction_id,
            "object": "response.compaction",
            "created_at": created_at,
            "output": output,
            "usage": usage or _NO_USAGE,
        }
    )


_NO_USAGE = {
    "input_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 0,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 0,
}
