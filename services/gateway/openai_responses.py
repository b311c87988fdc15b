"""Response shapes of the gateway's own endpoints, for ``/openapi.json`` only (never encoded).

The formatter writes chat and completion bodies with its shapers' Structs
(``services/formatter/shapers``); services do not import each other, so their shape is restated
here and ``tests/unit/gateway/test_openapi.py`` checks that the two agree field for field.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ResponseNvext(msgspec.Struct, kw_only=True):
    """Present when ``nvext.extra_fields`` asked for something."""

    worker_id: str | None = None
    """The worker that served the request (``extra_fields: ["worker_id"]``)."""
    timing: dict[str, float] | None = None
    """``ttft_ms``, ``itl_ms``… (``extra_fields: ["timing"]``)."""


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None


class ContentLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct, kw_only=True):
    content: list[ContentLogprob] | None


class Function(msgspec.Struct, kw_only=True):
    name: str
    arguments: str
    """JSON text of the arguments."""


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: Function


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None
    """``null`` when the message is only tool calls."""
    reasoning_content: str | None = None
    """The reasoning block (models with a reasoning parser)."""
    tool_calls: list[ToolCall] | None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str
    """``stop``, ``length``, ``tool_calls``."""


class ChatCompletion(msgspec.Struct, kw_only=True):
    """``chat.completion``; with ``stream: true`` the body is SSE ``chat.completion.chunk``
    events (``ChatCompletionChunk``) ending in ``data: [DONE]``."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    nvext: ResponseNvext | None = None


class FunctionDelta(msgspec.Struct, kw_only=True):
    name: str | None = None
    arguments: str


class ToolCallDelta(msgspec.Struct, kw_only=True):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class Delta(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """One SSE ``data:`` event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    nvext: ResponseNvext | None = None


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class Completion(msgspec.Struct, kw_only=True):
    """``text_completion`` (the same object per SSE event when streaming)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    nvext: ResponseNvext | None = None


class Model(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


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
