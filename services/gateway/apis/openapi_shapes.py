"""Response shapes for ``/openapi.json``: the gateway's own endpoints (models, health; these are
also encoded by ``http/routes.py``) and the Anthropic Messages and OpenAI Responses bodies
(described only: the formatter writes those).

Chat and completion bodies are ``shared.api_objects``' Structs, the ones the formatter encodes.
Only the fields JetServe produces are described; both APIs' official documents define the rest.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# --- the gateway's own endpoints -----------------------------------------------------------------


class ModelWorkers(msgspec.Struct, kw_only=True):
    """``/v1/models``' extension ``jetserve``: who serves the model right now."""

    workers: dict[str, int]
    """Live workers by role, every role named: ``{"both": 0, "prefill": 2, "decode": 2}``
    (``both``: aggregated; ``prefill`` and ``decode``: disaggregated serving)."""
    dp_ranks: int
    """Data-parallel ranks of those workers together: the routing targets (a worker with
    ``--data-parallel-size 2`` counts two)."""


class Model(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str | None = None
    """A LoRA adapter's path (vLLM's ``root``); ``None`` for a base model."""
    parent: str | None = None
    """A LoRA adapter's base model, as vLLM lists it; ``None`` for a base model."""
    jetserve: ModelWorkers
    """JetServe's extension: the model's live workers by role and their data-parallel ranks
    (an adapter's: those that hold it)."""


class ModelList(msgspec.Struct, kw_only=True):
    """``GET /v1/models``: the models with a live worker."""

    object: Literal["list"] = "list"
    data: list[Model]


class Health(msgspec.Struct, kw_only=True):
    """``GET /health``: 200 when ready, 503 otherwise (with ``reason``)."""

    status: Literal["ok", "unavailable", "shutting_down"]
    models: list[str]
    reason: Literal["shutting_down", "nats_disconnected", "no_live_model"] | None = None


class Live(msgspec.Struct, kw_only=True):
    """``GET /live``: the process answers."""

    status: Literal["ok"] = "ok"


# --- Anthropic Messages and OpenAI Responses -----------------------------------------------------


class CountTokensResponse(msgspec.Struct, kw_only=True):
    """``POST /v1/messages/count_tokens``."""

    input_tokens: int


class AnthropicUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None


class AnthropicBlock(msgspec.Struct, kw_only=True):
    """A content block: ``text`` (``text``), ``thinking`` (``thinking``, ``signature``) or
    ``tool_use`` (``id``, ``name``, ``input``)."""

    type: Literal["text", "thinking", "tool_use"]
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


class AnthropicMessage(msgspec.Struct, kw_only=True):
    """``POST /v1/messages``: the message; with ``stream: true`` the SSE events
    ``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta`` and
    ``message_stop`` (errors: an ``error`` event, Anthropic's error shape)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[AnthropicBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None = None
    usage: AnthropicUsage


class ResponsesUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class ResponseItem(msgspec.Struct, kw_only=True):
    """An output item: ``message`` (``content`` of ``output_text`` parts), ``reasoning``
    (``summary`` / ``content``) or ``function_call`` (``call_id``, ``name``, ``arguments``)."""

    type: Literal["message", "reasoning", "function_call"]
    id: str
    status: str | None = None
    role: Literal["assistant"] | None = None
    content: list[dict[str, Any]] | None = None
    summary: list[dict[str, Any]] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None


class ResponseObject(msgspec.Struct, kw_only=True):
    """``POST /v1/responses`` (stateless): the response; with ``stream: true`` the documented
    event sequence from ``response.created`` to ``response.completed``."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "incomplete", "failed"]
    model: str
    output: list[ResponseItem]
    usage: ResponsesUsage | None = None


class AnthropicErrorDetail(msgspec.Struct, kw_only=True):
    type: str
    """``invalid_request_error``, ``not_found_error``, ``overloaded_error``, ``api_error``…"""
    message: str


class AnthropicError(msgspec.Struct, kw_only=True):
    """Every error of the Messages endpoints (Anthropic's shape)."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
