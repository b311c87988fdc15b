"""Pure: Anthropic Messages request bytes -> validated Struct -> ``shared.messages.Preprocess``.

``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` are served on top of the chat path:
the request becomes the equivalent OpenAI chat request (``openai.chat_from``, so tools,
``tool_choice`` and structured output are resolved exactly as for chat), whose ``Preprocess``
then asks for ``output.format="anthropic"``. The mapping:

- ``system`` (a string or text blocks) -> a ``system`` message;
- content blocks: ``text`` -> text; assistant ``tool_use`` -> ``tool_calls`` (the ``input``
  object as JSON-string ``arguments``); user ``tool_result`` -> a ``tool`` message with
  ``tool_call_id``; assistant ``thinking`` -> ``reasoning_content`` (``redacted_thinking`` is
  dropped: there is nothing to show the template);
- ``tools[].input_schema`` -> ``function.parameters``; ``tool_choice`` ``auto`` / ``any`` /
  ``tool`` / ``none`` -> ``auto`` / ``required`` / the named function / ``none``, and
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``;
- ``thinking`` ``enabled`` (``budget_tokens``) / ``adaptive`` -> ``enable_thinking: true`` (and
  ``max_thinking_tokens``), ``disabled`` or absent -> ``enable_thinking: false`` (Anthropic never
  thinks unless asked);
- ``output_config.format`` (``json_schema``) -> a guided JSON schema;
- ``stop_sequences`` -> stop strings (no limit on their number, as Anthropic).

- user ``image`` blocks (``source`` ``base64`` or ``url``) -> ``image_url`` parts (a base64
  source as a ``data:`` URL), each naming its block for errors (decision 032): a model without
  vision refuses them in the preprocessor (400), as it does a URL of a host not allowed.

Documents are refused (400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from services.gateway.apis.bodies import Decoders
from services.gateway.apis.nvext import NO_HEADERS, RoutingHeaders
from services.gateway.apis.openai import chat_from, chat_to_preprocess
from services.gateway.apis.openai_types import ChatCompletionRequest
from shared.errors import InvalidRequest
from shared.messages import Preprocess

MIN_THINKING_BUDGET = 1024
"""Anthropic's smallest ``thinking.budget_tokens``."""

PositiveInt = Annotated[int, Meta(ge=1)]
ToolName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


# --- content blocks ------------------------------------------------------------------------------


class _Block(msgspec.Struct, kw_only=True, tag_field="type"):
    cache_control: dict[str, Any] | None = None
    """Prompt-caching breakpoint: prefix caching here is automatic, so it changes nothing."""


class TextBlock(_Block, tag="text"):
    text: str
    citations: list[dict[str, Any]] | None = None


class ToolUseBlock(_Block, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block, tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None


class Base64Source(msgspec.Struct, kw_only=True, tag_field="type", tag="base64"):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class UrlSource(msgspec.Struct, kw_only=True, tag_field="type", tag="url"):
    url: str


class ImageBlock(_Block, tag="image"):
    source: Base64Source | UrlSource


class ThinkingBlock(_Block, tag="thinking"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block, tag="redacted_thinking"):
    data: str


Block = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)


class MessageParam(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[Block]


# --- tools and options ---------------------------------------------------------------------------


class ToolParam(msgspec.Struct, kw_only=True):
    name: ToolName
    input_schema: dict[str, Any]
    description: str | None = None
    type: str | None = None
    """``custom`` (or absent): a client tool. Anthropic's server tools are refused."""
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None


class _Choice(msgspec.Struct, kw_only=True, tag_field="type"):
    disable_parallel_tool_use: bool | None = None


class ChoiceAuto(_Choice, tag="auto"):
    pass


class ChoiceAny(_Choice, tag="any"):
    pass


class ChoiceTool(_Choice, tag="tool"):
    name: str


class ChoiceNone(_Choice, tag="none"):
    pass


ToolChoiceParam = ChoiceAuto | ChoiceAny | ChoiceTool | ChoiceNone


class _Thinking(msgspec.Struct, kw_only=True, tag_field="type"):
    display: Literal["summarized", "omitted"] | None = None


class ThinkingEnabled(_Thinking, tag="enabled"):
    budget_tokens: PositiveInt


class ThinkingDisabled(_Thinking, tag="disabled"):
    pass


class ThinkingAdaptive(_Thinking, tag="adaptive"):
    pass


class ThinkingBetweenTools(_Thinking, tag="between_tools"):
    pass


ThinkingParam = ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive | ThinkingBetweenTools


class JsonOutputFormat(msgspec.Struct, kw_only=True):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, kw_only=True):
    format: JsonOutputFormat | None = None
    effort: str | None = None
    """Claude's effort level: open models have no such control (accepted, not acted on)."""


# --- requests ------------------------------------------------------------------------------------


class CountTokensRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/messages/count_tokens``: what the prompt is made of."""

    model: str
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None
    # accepted, not acted on (IGNORED says why)
    cache_control: dict[str, Any] | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    """``POST /v1/messages``."""

    max_tokens: PositiveInt
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    stream: bool | None = None
    metadata: dict[str, Any] | None = None
    # accepted, not acted on (IGNORED says why)
    service_tier: str | None = None
    container: Any = None
    inference_geo: str | None = None
    diagnostics: dict[str, Any] | None = None


class StrictCountTokensRequest(CountTokensRequest, kw_only=True, forbid_unknown_fields=True):
    pass


class StrictMessagesRequest(MessagesRequest, kw_only=True, forbid_unknown_fields=True):
    pass


IGNORED: dict[str, str] = {
    "metadata": "`metadata.user_id` is for Anthropic's abuse detection; nothing monitors users.",
    "service_tier": "Anthropic's priority capacity; every request here is served alike.",
    "cache_control": "Prompt-caching breakpoints: prefix caching is automatic here.",
    "container": "Anthropic's code-execution container; there are no server tools here.",
    "inference_geo": "Where Anthropic runs inference; this server runs where it runs.",
    "diagnostics": "Anthropic's prompt-cache diagnostics; none are reported here.",
    "speed": "Claude's fast mode; the served model has one speed.",
    "user_profile_id": "Anthropic account routing; there are no accounts here.",
    "workspace_id": "Anthropic account routing; there are no accounts here.",
    "output_config.effort": "Claude's effort level; open models have no such control.",
    "thinking.display": "Thinking text is always shown (never summarized or omitted).",
}
"""Anthropic request fields accepted but not acted on, with the reason."""

_MESSAGES: Decoders[MessagesRequest] = Decoders(
    StrictMessagesRequest, MessagesRequest, "Messages request"
)
_COUNT: Decoders[CountTokensRequest] = Decoders(
    StrictCountTokensRequest, CountTokensRequest, "count_tokens request"
)


def parse_messages(body: bytes, *, allow_unknown: bool = False) -> MessagesRequest:
    """Decode and check a ``/v1/messages`` body."""
    request = _MESSAGES.decode(body, allow_unknown=allow_unknown)
    _check(request)
    if request.stop_sequences is not None:
        for i, stop in enumerate(request.stop_sequences):
            if not stop or stop.isspace():
                raise InvalidRequest(
                    "`stop_sequences` must contain non-whitespace strings.",
                    param=f"stop_sequences[{i}]",
                )
    thinking = request.thinking
    if isinstance(thinking, ThinkingEnabled):
        if thinking.budget_tokens < MIN_THINKING_BUDGET:
            raise InvalidRequest(
                f"`thinking.budget_tokens` must be at least {MIN_THINKING_BUDGET}.",
                param="thinking.budget_tokens",
            )
        if thinking.budget_tokens >= request.max_tokens:
            raise InvalidRequest(
                "`max_tokens` must be greater than `thinking.budget_tokens`.",
                param="thinking.budget_tokens",
            )
    return request


def parse_count_tokens(body: bytes, *, allow_unknown: bool = False) -> CountTokensRequest:
    """Decode and check a ``/v1/messages/count_tokens`` body."""
    request = _COUNT.decode(body, allow_unknown=allow_unknown)
    _check(request)
    return request


@dataclass(frozen=True, slots=True)
class Converted:
    """A checked Messages request as the chat path takes it, and its stop strings."""

    chat: ChatCompletionRequest
    stop: tuple[str, ...] = ()


def to_chat(request: CountTokensRequest) -> Converted:
    """The equivalent chat request, checked as a chat body is (tools, ``tool_choice``…)."""
    stops = request.stop_sequences if isinstance(request, MessagesRequest) else None
    return Converted(chat_from(chat_fields(request)), tuple(stops or ()))


def messages_to_preprocess(
    converted: Converted,
    *,
    request_id: str,
    reply_to: str,
    created: int,
    deadline_ms: int = 0,
    headers: RoutingHeaders = NO_HEADERS,
) -> Preprocess:
    """The bus form of a Messages (or count_tokens) request: ``format="anthropic"``."""
    preprocess = chat_to_preprocess(
        converted.chat,
        request_id=request_id,
        reply_to=reply_to,
        created=created,
        deadline_ms=deadline_ms,
        headers=headers,
    )
    output = msgspec.structs.replace(preprocess.output, format="anthropic", stop=converted.stop)
    return msgspec.structs.replace(preprocess, output=output)


def chat_fields(request: CountTokensRequest) -> dict[str, Any]:
    """The OpenAI chat request equivalent to ``request`` (as values for ``chat_from``)."""
    fields: dict[str, Any] = {"model": request.model, "messages": _messages(request)}
    if request.tools:
        fields["tools"] = [_tool(t) for t in request.tools]
    choice = request.tool_choice
    if choice is not None:
        fields["tool_choice"] = _choice(choice)
        if choice.disable_parallel_tool_use:
            fields["parallel_tool_calls"] = False
    thinking = request.thinking
    enabled = thinking is not None and not isinstance(thinking, ThinkingDisabled)
    fields["chat_template_kwargs"] = {"enable_thinking": enabled}
    if isinstance(thinking, ThinkingEnabled):
        fields["nvext"] = {"max_thinking_tokens": thinking.budget_tokens}
    output = request.output_config
    if output is not None and output.format is not None:
        schema = {"name": "output", "schema": output.format.schema}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    if isinstance(request, MessagesRequest):
        fields["max_tokens"] = request.max_tokens
        for name in ("temperature", "top_p", "top_k", "stream"):
            value = getattr(request, name)
            if value is not None:
                fields[name] = value
    return fields


# --- helpers -------------------------------------------------------------------------------------


def _check(request: CountTokensRequest) -> None:
    if not request.model:
        raise InvalidRequest("`model` must not be empty.", param="model")
    if not request.messages:
        raise InvalidRequest("`messages` must contain at least one message.", param="messages")
    for i, tool in enumerate(request.tools or ()):
        if tool.type not in (None, "custom"):
            raise InvalidRequest(
                f"Server tool `{tool.type}` is not available here; only client tools "
                "(`name`, `description`, `input_schema`) are supported.",
                param=f"tools[{i}].type",
            )
        if tool.input_schema.get("type", "object") != "object":
            raise InvalidRequest(
                '`input_schema` must be a JSON Schema with `"type": "object"`.',
                param=f"tools[{i}].input_schema",
            )
    choice = request.tool_choice
    if isinstance(choice, ChoiceAny | ChoiceTool) and not request.tools:
        raise InvalidRequest(
            f"`tool_choice` `{'any' if isinstance(choice, ChoiceAny) else 'tool'}` needs `tools`.",
            param="tool_choice",
        )
    if isinstance(choice, ChoiceTool) and choice.name not in {t.name for t in request.tools or ()}:
        raise InvalidRequest(
            f"`tool_choice.name` `{choice.name}` is not one of `tools`.",
            param="tool_choice.name",
        )


def _system_text(system: str | list[TextBlock]) -> str:
    return system if isinstance(system, str) else "\n".join(b.text for b in system)


def _messages(request: CountTokensRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": _system_text(request.system)})
    for i, message in enumerate(request.messages):
        content = message.content
        if isinstance(content, str):
            out.append({"role": message.role, "content": content})
        elif message.role == "user":
            out.extend(_user_blocks(i, content))
        else:
            out.append(_assistant_blocks(i, content))
    return out


def _user_blocks(index: int, blocks: list[Block]) -> list[dict[str, Any]]:
    """A user turn: its tool results as ``tool`` messages, its text and images as a user
    message."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    parts: list[dict[str, Any]] = []  # with images: text and image parts in order
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(_image_part(block, f"messages[{index}].content[{j}]"))
        elif isinstance(block, ToolResultBlock):
            if parts:
                out.append({"role": "user", "content": _user_content(texts, parts)})
                texts, parts = [], []
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id,
                    "content": _result_text(block.content),
                }
            )
        else:
            raise InvalidRequest(
                f"A user message cannot hold a `{_block_type(block)}` block.",
                param=f"messages[{index}].content[{j}].type",
            )
    if parts or not out:
        out.append({"role": "user", "content": _user_content(texts, parts)})
    return out


def _user_content(texts: list[str], parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    return parts if len(parts) > len(texts) else "\n".join(texts)


def _image_part(block: ImageBlock, param: str) -> dict[str, Any]:
    """An image block as the chat path's ``image_url`` part (a base64 source as a data URL)."""
    source = block.source
    url = (
        source.url
        if isinstance(source, UrlSource)
        else f"data:{source.media_type};base64,{source.data}"
    )
    return {"type": "image_url", "image_url": {"url": url}, "param": param}


def _assistant_blocks(index: int, blocks: list[Block]) -> dict[str, Any]:
    """An assistant turn: text, ``tool_calls`` and ``reasoning_content`` of one message."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            arguments = msgspec.json.encode(block.input).decode()
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, ToolResultBlock | ImageBlock):
            raise InvalidRequest(
                f"An assistant message cannot hold `{_block_type(block)}` blocks.",
                param=f"messages[{index}].content[{j}].type",
            )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        out["tool_calls"] = calls
    if thoughts:
        out["reasoning_content"] = "".join(thoughts)
    return out


def _result_text(content: str | list[TextBlock] | None) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else "\n".join(b.text for b in content)


def _block_type(block: Block) -> str:
    return str(type(block).__struct_config__.tag)


def _tool(tool: ToolParam) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _choice(choice: ToolChoiceParam) -> Any:
    if isinstance(choice, ChoiceAuto):
        return "auto"
    if isinstance(choice, ChoiceAny):
        return "required"
    if isinstance(choice, ChoiceNone):
        return "none"
    return {"type": "function", "function": {"name": choice.name}}
