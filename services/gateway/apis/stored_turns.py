"""Pure: stored Responses turns (decision 030): response ids, the record a turn leaves in the
store, the conversation a chain of turns makes, and the bodies of ``GET`` / ``DELETE
/v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``.

A record (``StoredTurn``) holds one turn: its own input items (as ``input_items`` lists them,
each with an id), the ``response`` object exactly as the client got it, and the ids of the
turns before it (``ancestors``, oldest first), so a continuation reads every earlier turn at
once instead of one hop at a time. A record over the store's limit is kept as a marker
(``omitted_bytes``): asking for it, or continuing from it, says why it is missing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

from shared import sse
from shared.errors import InvalidRequest, NotFound

RESPONSE_PREFIX = "resp_"
MAX_ID_LEN = 128
_ID = re.compile(r"^[A-Za-z0-9_-]+$")
FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
"""The stream events that carry the finished ``response``."""
MAX_LIST_LIMIT = 100
DEFAULT_LIST_LIMIT = 20


class ResponseNotFound(NotFound):
    """``GET`` / ``DELETE`` of a response that is not stored (404, OpenAI's message)."""

    type = "invalid_request_error"

    def __init__(self, response_id: str, why: str = "") -> None:
        super().__init__(f"Response with id '{response_id}' not found.{why}")


class PreviousResponseNotFound(InvalidRequest):
    """``previous_response_id`` names no stored response (400, as OpenAI answers)."""

    code = "previous_response_not_found"

    def __init__(self, response_id: str, why: str = "") -> None:
        super().__init__(
            f"Previous response with id '{response_id}' not found.{why}",
            param="previous_response_id",
        )


class InvalidId(InvalidRequest):
    """A response id that cannot be one (OpenAI's ``invalid_value``)."""

    code = "invalid_value"


class StoredTurn(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One turn as the store keeps it (JSON; the KV value of key ``response.id``)."""

    id: str
    input: list[dict[str, Any]] = []
    """This turn's input items, as ``input_items`` lists them (each with an ``id``)."""
    response: dict[str, Any] = {}
    """The ``response`` object as the client got it."""
    ancestors: list[str] = []
    """The ids of the turns it continues, oldest first."""
    omitted_bytes: int = 0
    """Not stored: the record would have had this many bytes, over the store's limit."""


def check_response_id(value: str, param: str) -> str:
    """``value`` if it can be a response id (OpenAI's checks and messages), else 400."""
    if not _ID.match(value) or len(value) > MAX_ID_LEN:
        raise InvalidId(
            f"Invalid '{param}': '{value[:MAX_ID_LEN]}'. Expected an ID that contains letters, "
            "numbers, underscores, or dashes, but this value contained additional characters.",
            param=param,
        )
    if not value.startswith("resp"):
        raise InvalidId(
            f"Invalid '{param}': '{value}'. Expected an ID that begins with 'resp'.", param=param
        )
    return value


def omitted_why(turn: StoredTurn, limit_bytes: int) -> str:
    """Why a turn kept as a marker has no record (empty for a stored one)."""
    if not turn.omitted_bytes:
        return ""
    return (
        f" It was not stored: its record of {turn.omitted_bytes} bytes is over the store's "
        f"limit of {limit_bytes} bytes (--responses-max-stored-bytes)."
    )


def check_storable(items: Sequence[dict[str, Any]], limit_bytes: int) -> None:
    """400 when a turn's input alone is over the store's record limit (before any work)."""
    size = len(msgspec.json.encode(items))
    if size > limit_bytes:
        raise InvalidRequest(
            f"This turn's input is {size} bytes, over the limit of {limit_bytes} bytes for a "
            "stored turn (--responses-max-stored-bytes): send it with `store: false`, or in "
            "smaller turns.",
            param="input",
        )


def conversation(turns: Sequence[StoredTurn]) -> list[dict[str, Any]]:
    """The items a chain of turns (oldest first) makes: each turn's input, then its output."""
    items: list[dict[str, Any]] = []
    for turn in turns:
        items += turn.input
        items += turn.response.get("output") or []
    return items


def input_record(raw: str | list[dict[str, Any]], new_id: Any) -> list[dict[str, Any]]:
    """A request's ``input`` as ``input_items`` lists it: every item with a ``type`` and an
    ``id`` (``new_id(prefix)`` makes one), a message's text content as a list of parts."""
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        entry = {"type": kind, **item}
        if kind == "message":
            entry.setdefault("status", "completed")
            content = entry.get("content")
            if isinstance(content, str):
                part = "output_text" if entry.get("role") == "assistant" else "input_text"
                entry["content"] = [{"type": part, "text": content}]
        if "id" not in entry or not entry["id"]:
            entry["id"] = new_id("msg" if kind == "message" else "item")
        out.append(entry)
    return out


def final_response(data: bytes, *, stream: bool) -> dict[str, Any] | None:
    """The finished ``response`` object in the formatter's last bytes: the whole body, or the
    last stream event that carries it (``FINAL_EVENTS``); ``None`` if there is none."""
    if not stream:
        body = _json(data)
        return body if isinstance(body, dict) and body.get("object") == "response" else None
    for frame in reversed(data.split(sse.END)):
        for line in frame.split(b"\n"):
            if not line.startswith(sse.PREFIX):
                continue
            event = _json(line[len(sse.PREFIX) :])
            if isinstance(event, dict) and event.get("type") in FINAL_EVENTS:
                response = event.get("response")
                return response if isinstance(response, dict) else None
    return None


def _json(data: bytes) -> Any:
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None


def deleted_body(response_id: str) -> bytes:
    """``DELETE /v1/responses/{id}``'s answer."""
    return msgspec.json.encode({"id": response_id, "object": "response", "deleted": True})


class ListQuery(msgspec.Struct, kw_only=True):
    """``GET /v1/responses/{id}/input_items``' query parameters."""

    after: str | None = None
    limit: int = DEFAULT_LIST_LIMIT
    order: str = "desc"


def list_query(params: dict[str, str]) -> ListQuery:
    """The listing's query, checked (400 naming the parameter)."""
    limit_text = params.get("limit", str(DEFAULT_LIST_LIMIT))
    try:
        limit = int(limit_text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidRequest(
            f"Invalid 'limit': '{limit_text}'. Expected an integer from 1 to {MAX_LIST_LIMIT}.",
            param="limit",
        )
    order = params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest(
            f"Invalid 'order': '{order}'. Expected 'asc' or 'desc'.", param="order"
        )
    return ListQuery(after=params.get("after") or None, limit=limit, order=order)


def input_items_page(items: Sequence[dict[str, Any]], query: ListQuery) -> bytes:
    """One page of the items a response was made from (OpenAI's list object)."""
    ordered = list(items) if query.order == "asc" else list(reversed(items))
    if query.after is not None:
        ids = [item.get("id") for item in ordered]
        if query.after not in ids:
            raise InvalidRequest(
                f"Invalid 'after': no item with id '{query.after}' in this response's input.",
                param="after",
            )
        ordered = ordered[ids.index(query.after) + 1 :]
    page = ordered[: query.limit]
    return msgspec.json.encode(
        {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(ordered) > len(page),
        }
    )
