"""OpenAI response objects (``chat.completion``, ``chat.completion.chunk``, ``text_completion``):
the formatter encodes them, the gateway describes them in ``/openapi.json``. One definition.

Pure msgspec Structs. Field order is OpenAI's and is the bytes' order; ``UNSET`` fields are
left out of the JSON (and are optional in the schema). Names that the gateway's request Structs
also use (``ChatMessage``, ``Nvext``) are avoided so that the document's schema names stay plain.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0
    """Prompt tokens read from the prefix cache."""


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    """OpenAI ``usage``, always with ``prompt_tokens_details.cached_tokens``."""
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


class ResponseNvext(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Response extension asked for with ``nvext.extra_fields`` (``worker_id``: who served;
    ``timing``: time to first token and between tokens)."""

    worker_id: str | WorkerPair | UnsetType = UNSET
    """The worker that served the request (``extra_fields: ["worker_id"]``): its id, or for a
    disaggregated request (and a query-only answer) the prefill and decode workers, as
    Dynamo's response names them."""
    dp_rank: int | UnsetType = UNSET
    """The data-parallel rank of ``worker_id`` when above 0 (aggregated requests)."""
    timing: dict[str, float] | UnsetType = UNSET
    """``ttft_ms``, ``itl_ms``… (``extra_fields: ["timing"]``)."""
    token_ids: tuple[int, ...] | UnsetType = UNSET
    """A query-only answer (``nvext.annotations: ["query_instance_id"]``): the prompt's ids."""


class WorkerPair(msgspec.Struct, kw_only=True):
    """Where a request's two phases ran (or would run): Dynamo's ``WorkerIdInfo``."""

    prefill_worker_id: str | None
    """None: the decode worker prefilled it too (aggregated, or kept local)."""
    prefill_dp_rank: int | None
    decode_worker_id: str
    decode_dp_rank: int


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: tuple[int, ...] | None


class ContentLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: tuple[int, ...] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct, kw_only=True):
    content: list[ContentLogprob] | None


class FunctionDelta(msgspec.Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str


class ToolCallDelta(msgspec.Struct, kw_only=True):
    index: int
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: FunctionDelta


class Delta(msgspec.Struct, kw_only=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET
    function_call: FunctionDelta | UnsetType = UNSET
    """The deprecated ``functions`` form of a tool call (``OutputOptions.legacy_functions``)."""


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """One SSE ``data:`` event of a streamed chat completion."""

    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | UnsetType | None = UNSET
    """Absent unless ``include_usage``; then ``null`` on every chunk but the last."""
    nvext: ResponseNvext | UnsetType = UNSET
    """Only on the last finish chunk, and only when ``nvext.extra_fields`` asked for something."""


class Function(msgspec.Struct, kw_only=True):
    name: str
    arguments: str
    """JSON text of the arguments."""


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function"
    function: Function


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str | None
    """``null`` when the message is only tool calls (as OpenAI)."""
    reasoning_content: str | UnsetType = UNSET
    """The reasoning block (models with a reasoning parser)."""
    tool_calls: list[ToolCall] | UnsetType = UNSET
    function_call: Function | UnsetType = UNSET
    """The deprecated ``functions`` form of the (one) tool call."""


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str
    """``stop``, ``length``, ``tool_calls`` (``function_call`` for the deprecated
    ``functions``)."""


class ChatCompletion(msgspec.Struct, kw_only=True):
    """``chat.completion``; with ``stream: true`` the body is SSE ``chat.completion.chunk``
    events (``ChatCompletionChunk``) ending in ``data: [DONE]``."""

    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    nvext: ResponseNvext | UnsetType = UNSET


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
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET
    nvext: ResponseNvext | UnsetType = UNSET
