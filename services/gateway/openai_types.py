"""OpenAI request bodies as msgspec Structs (HTTP shapes, distinct from bus messages).

Unknown fields are ignored. Optional fields are ``X | None`` so that clients which send an
explicit ``null`` are accepted; ``translate.py`` resolves the defaults. Value ranges live here as
``msgspec.Meta`` constraints so one decode both parses and validates.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
TopK = Annotated[int, Meta(ge=-1)]


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a multi-part message content; only ``text`` parts are supported."""

    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None
    """vLLM extension: usage on every chunk."""


NonNegativeFloat = Annotated[float, Meta(ge=0.0)]
CacheSalt = Annotated[str, Meta(min_length=1, max_length=256)]


class Nvext(msgspec.Struct, kw_only=True):
    """NVIDIA's request extension (as Dynamo's frontend): routing overrides, extra fields."""

    backend_instance_id: str | int | None = None
    """Pin the request to this worker (like the ``x-worker-instance-id`` header)."""
    overlap_score_weight: NonNegativeFloat | None = None
    router_temperature: NonNegativeFloat | None = None
    extra_fields: list[str] | None = None
    """Extra response fields under ``nvext``; ``"worker_id"`` is the one served."""


class _SamplingFields(msgspec.Struct, kw_only=True):
    """Fields shared by chat and completions (OpenAI plus the vLLM extensions)."""

    model: str
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: bool | int | None = None
    user: str | None = None
    # vLLM extensions
    ignore_eos: bool | None = None
    min_tokens: NonNegativeInt | None = None
    top_k: TopK | None = None
    stop_token_ids: list[NonNegativeInt] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    # routing extensions
    nvext: Nvext | None = None
    cache_salt: CacheSalt | None = None
    """Tenant isolation: requests with different salts never share KV-cache blocks."""


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: PositiveInt | None = None
    """Newer name of ``max_tokens``; wins when both are set."""
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/completions``."""

    prompt: str | list[Any]
    """A string, a one-element list of strings, or token ids (``list[int]``)."""
    echo: bool | None = None


class ErrorDetail(msgspec.Struct, kw_only=True):
    """The ``error`` object of an OpenAI error body."""

    message: str
    type: str
    code: str
    param: str | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    """Every error answer (written by ``ServiceError.body``); documents the API, never decoded."""

    error: ErrorDetail
