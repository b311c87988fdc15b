"""OpenAI request bodies as msgspec Structs (HTTP shapes, distinct from bus messages).

Optional fields are ``X | None`` so that clients which send an explicit ``null`` are accepted;
``openai.py`` resolves the defaults. Value ranges live here as ``msgspec.Meta`` constraints so
one decode both parses and validates.

Unknown top-level fields: the ``Strict*`` subclasses forbid them (the gateway's default, a 400
naming them); the base classes ignore them (``--allow-unknown-fields``). Fields that OpenAI
documents but the gateway does not act on are declared here all the same, so strict decoding
accepts them; ``accepted_fields.IGNORED`` says why each one is not acted on. Nested objects
(messages, ``nvext``, ``stream_options``) ignore unknown keys, as OpenAI's and Dynamo's do.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=100.0)]
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
INT64_MAX = 2**63 - 1
"""Integers travel in MessagePack on the bus: every one must fit in 64 bits (a 400 if not)."""
PositiveInt = Annotated[int, Meta(ge=1, le=INT64_MAX)]
NonNegativeInt = Annotated[int, Meta(ge=0, le=INT64_MAX)]
TopK = Annotated[int, Meta(ge=-1, le=INT64_MAX)]
Seed = Annotated[int, Meta(ge=-(2**63), le=INT64_MAX)]
N = Annotated[int, Meta(ge=1, le=128)]
"""Choices per request (vLLM allows any; 128 bounds the work one request can ask for)."""
MAX_DP_RANK = 65535
DpRank = Annotated[int, Meta(ge=0, le=MAX_DP_RANK)]
"""A data-parallel rank (``nvext.dp_rank``, ``prefill_dp_rank``, their headers): syntax only
here; a rank beyond the pinned worker's ``dp_size`` is the router's 400."""
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]
CompletionLogprobs = Annotated[int, Meta(ge=0, le=5)]
BiasValue = Annotated[float, Meta(ge=-100.0, le=100.0)]
LogitBias = Annotated[dict[str, BiasValue], Meta(max_length=300)]
"""Token id (as a string, JSON keys are strings) -> bias added to its logit."""
FunctionName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
TokenId = Annotated[int, Meta(ge=0, le=2**32 - 1)]
U32 = Annotated[int, Meta(ge=0, le=2**32 - 1)]
NonNegativeFloat = Annotated[float, Meta(ge=0.0)]
CacheSalt = Annotated[str, Meta(min_length=1, max_length=256)]
MAX_PRIORITY_S = 3600.0
Priority = Annotated[float, Meta(ge=-MAX_PRIORITY_S, le=MAX_PRIORITY_S)]
"""Seconds a request moves ahead in its queue tier (negative: behind); finite, at most an hour."""
MAX_STRICT_PRIORITY = 100
StrictPriority = Annotated[int, Meta(ge=0, le=MAX_STRICT_PRIORITY)]
MAX_OSL = 10_000_000
ExpectedOutputTokens = Annotated[int, Meta(ge=1, le=MAX_OSL)]
"""``nvext.agent_hints.osl``: bounded by any context length a model has today."""
SESSION_ID_PATTERN = r"^[!-~]{1,256}$"
SessionId = Annotated[str, Meta(pattern=SESSION_ID_PATTERN)]
"""1 to 256 printable ASCII characters, no spaces (as the session headers)."""


class ImageUrl(msgspec.Struct, kw_only=True):
    """``image_url`` of an image part: a ``data:`` URL, or an http(s) URL where allowed."""

    url: str
    detail: Literal["auto", "low", "high"] | None = None
    """Accepted, not acted on: the model's own rule sets an image's token count."""


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a multi-part message content: ``text`` or ``image_url`` (decision 032)."""

    type: str
    text: str | None = None
    image_url: ImageUrl | None = None
    param: str | None = None
    """Where the part was in another front end's body (``messages[0].content[1]`` of a Messages
    request), for errors; absent: its place in this chat request."""


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    function_call: dict[str, Any] | None = None
    """Deprecated form of ``tool_calls`` (one call); kept for the chat template."""


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None
    """vLLM extension: usage on every chunk."""


# --- tools and structured outputs ---------------------------------------------------------------


class FunctionDefinition(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``tools[].function``: what the model may call."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON Schema object for the arguments (absent: no arguments)."""
    strict: bool | None = None


class Tool(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``tools[]``: only ``function`` tools (OpenAI's ``custom`` tools are refused)."""

    type: Literal["function"]
    function: FunctionDefinition


class FunctionRef(msgspec.Struct, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``: call this function."""

    type: Literal["function"]
    function: FunctionRef


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    """``response_format.json_schema``."""

    name: FunctionName
    description: str | None = None
    schema: dict[str, Any] | None = None
    """The JSON Schema the output must satisfy (absent: any JSON value)."""
    strict: bool | None = None


class ResponseFormatText(msgspec.Struct, kw_only=True, tag_field="type", tag="text"):
    """Plain text (the default)."""


class ResponseFormatJsonObject(msgspec.Struct, kw_only=True, tag_field="type", tag="json_object"):
    """Any JSON object."""


class ResponseFormatJsonSchema(msgspec.Struct, kw_only=True, tag_field="type", tag="json_schema"):
    """A JSON document valid against ``json_schema.schema``."""

    json_schema: JsonSchemaFormat


ResponseFormat = ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema


class LegacyFunctionCall(msgspec.Struct, kw_only=True):
    """Deprecated ``function_call: {"name": ...}``."""

    name: str


# --- nvext ---------------------------------------------------------------------------------------


class AgentHints(msgspec.Struct, kw_only=True):
    """``nvext.agent_hints`` (Dynamo's names): the router queue's inputs. Unknown keys are
    ignored, as everywhere in ``nvext``."""

    priority: Priority | None = None
    """Seconds the request moves ahead in its tier's queue (``x-dynamo-request-priority``)."""
    strict_priority: StrictPriority | None = None
    """The queue tier, higher served first (``x-dynamo-request-strict-priority``)."""
    osl: ExpectedOutputTokens | None = None
    """Expected output tokens (the router's decode-load estimate)."""
    speculative_prefill: bool | None = None
    """Warm the next turn's prefix on the same worker when this turn ends."""
    latency_sensitivity: Priority | None = None
    """Dynamo's deprecated alias of ``priority`` (used only when ``priority`` is absent)."""


class AgentContext(msgspec.Struct, kw_only=True):
    """``nvext.agent_context``: only ``session_id`` is read (``X-Dynamo-Session-ID``)."""

    session_id: SessionId | None = None


class Nvext(msgspec.Struct, kw_only=True):
    """NVIDIA's request extension, as Dynamo's frontend reads it.

    Unknown keys are ignored (Dynamo's latest frontend refuses them; older ones did not, and
    clients written for either version must work here).

    ``agent_hints`` and ``agent_context.session_id`` feed the router's admission queue and
    session affinity (issue 26, ``admission_hints.py``); Dynamo's other agent fields
    (``session_control``, ``routing_constraints``, ``request_timestamp_ms``, ``router``) are
    accepted and ignored. The disaggregation pins are honoured (issue 24).
    """

    backend_instance_id: str | int | None = None
    """Pin the request to this worker (like the ``x-worker-instance-id`` header)."""
    decode_worker_id: str | int | None = None
    """Pin the decode (or aggregated) phase to this worker; wins over ``backend_instance_id``
    (both given must agree)."""
    prefill_worker_id: str | int | None = None
    """Pin the prefill phase to this prefill worker (``x-dynamo-prefill-instance-id``)."""
    dp_rank: DpRank | None = None
    """The data-parallel rank of the pinned decode worker (``x-dynamo-dp-rank``)."""
    prefill_dp_rank: DpRank | None = None
    """The data-parallel rank of the pinned prefill worker (``x-dynamo-prefill-dp-rank``)."""
    allowed_worker_ids: list[str | int] | None = None
    """Only these workers are candidates for routing."""
    overlap_score_weight: NonNegativeFloat | None = None
    router_temperature: NonNegativeFloat | None = None
    extra_fields: list[str] | None = None
    """Extra response fields under ``nvext``: ``worker_id`` and ``timing`` are served."""
    annotations: list[str] | None = None
    """Out-of-band SSE ``event:`` frames: ``request_id``, ``formatted_prompt``, ``token_ids``."""
    token_data: Annotated[list[TokenId], Meta(min_length=1)] | None = None
    """The prompt, already tokenized: the gateway's template and tokenizer are skipped."""
    use_raw_prompt: bool | None = None
    """Tokenize the prompt as it is, without the chat template."""
    greed_sampling: bool | None = None
    """Always the most likely token, whatever the other sampling parameters say."""
    max_thinking_tokens: U32 | None = None
    cache_salt: CacheSalt | None = None
    """KV-cache isolation; wins over the top-level ``cache_salt`` (as in Dynamo)."""
    agent_hints: AgentHints | None = None
    agent_context: AgentContext | None = None


# --- requests ------------------------------------------------------------------------------------


class _SamplingFields(msgspec.Struct, kw_only=True):
    """Fields shared by chat and completions (OpenAI plus the vLLM extensions)."""

    model: str
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: N | None = None
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    # vLLM extensions
    ignore_eos: bool | None = None
    min_tokens: NonNegativeInt | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    # routing extensions
    nvext: Nvext | None = None
    cache_salt: CacheSalt | None = None
    """Tenant isolation: requests with different salts never share KV-cache blocks."""
    # accepted, not acted on (accepted_fields.IGNORED says why)
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: PositiveInt | None = None
    """Newer name of ``max_tokens``; wins when both are set."""
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    """Alternatives per token (needs ``logprobs: true``)."""
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    functions: list[FunctionDefinition] | None = None
    """Deprecated form of ``tools``."""
    function_call: Literal["none", "auto"] | LegacyFunctionCall | None = None
    """Deprecated form of ``tool_choice``."""
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    # accepted, not acted on (accepted_fields.IGNORED says why)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/completions``."""

    prompt: str | list[Any]
    """A string, a one-element list of strings, or token ids (``list[int]``)."""
    echo: bool | None = None
    logprobs: CompletionLogprobs | None = None
    """Log-probabilities of this many most likely tokens besides the sampled one."""
    best_of: PositiveInt | None = None
    """Only ``null`` or equal to ``n``: server-side best-of-n selection is not implemented."""
    suffix: str | None = None
    """Only ``null`` or empty: insertion is not implemented."""


class StrictChatCompletionRequest(ChatCompletionRequest, kw_only=True, forbid_unknown_fields=True):
    """``ChatCompletionRequest`` refusing unknown top-level fields."""


class StrictCompletionRequest(CompletionRequest, kw_only=True, forbid_unknown_fields=True):
    """``CompletionRequest`` refusing unknown top-level fields."""


# --- errors --------------------------------------------------------------------------------------


class ErrorDetail(msgspec.Struct, kw_only=True):
    """The ``error`` object of an OpenAI error body."""

    message: str
    type: str
    code: str
    param: str | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    """Every error answer (written by ``ServiceError.body``); documents the API, never decoded."""

    error: ErrorDetail
