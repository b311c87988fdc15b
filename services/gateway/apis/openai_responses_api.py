"""Pure: OpenAI Responses request bytes -> validated Struct -> ``shared.messages.Preprocess``.

``POST /v1/responses``, stateless, on top of the chat path: the request becomes the equivalent
chat request (``translate.chat_from``), whose ``Preprocess`` asks for ``output.format=
"responses"``. The mapping:

- ``instructions`` -> a ``system`` message first; ``input`` as a string -> one user message;
- ``input`` items: ``message`` (``input_text`` / ``output_text`` / ``refusal`` parts; ``type``
  may be left out, as the API allows) -> a message of its role; ``function_call`` -> an
  assistant ``tool_calls`` entry (consecutive calls share one assistant message);
  ``function_call_output`` -> a ``tool`` message; ``reasoning`` -> the next assistant message's
  ``reasoning_content``;
- ``tools`` (flat ``{"type": "function", "name", "description", "parameters"}``), ``tool_choice``
  (``none`` / ``auto`` / ``required`` / ``{"type": "function", "name"}``),
  ``parallel_tool_calls``; ``max_output_tokens`` -> ``max_tokens``; ``temperature``, ``top_p``,
  ``presence_penalty``, ``frequency_penalty``;
  ``reasoning.effort`` -> ``enable_thinking`` (``none`` turns it off); ``text.format``
  ``json_schema`` / ``json_object`` -> guided JSON; ``top_logprobs`` (or ``include`` of
  ``message.output_text.logprobs``) -> log-probabilities on the output text.

Nothing is stored: ``store`` is accepted and the response says ``"store": false``;
``previous_response_id`` and ``conversation`` are refused (400), as are images, files and
OpenAI's hosted tools.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from services.gateway.apis.bodies import Decoders, invalid
from services.gateway.apis.nvext import NO_HEADERS, RoutingHeaders
from services.gateway.apis.openai import chat_from, chat_to_preprocess
from services.gateway.apis.openai_types import ChatCompletionRequest, Penalty
from shared.errors import InvalidRequest
from shared.messages import Preprocess

MIN_OUTPUT_TOKENS = 16
"""OpenAI's smallest ``max_output_tokens``."""
LOGPROBS_INCLUDE = "message.output_text.logprobs"

FunctionName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionTool(msgspec.Struct, kw_only=True):
    type: str
    name: FunctionName | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(msgspec.Struct, kw_only=True):
    type: str
    name: str | None = None


class ReasoningParam(msgspec.Struct, kw_only=True):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class TextFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextParam(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/responses``."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[int, Meta(ge=MIN_OUTPUT_TOKENS)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    stream: bool | None = None
    reasoning: ReasoningParam | None = None
    text: TextParam | None = None
    include: list[str] | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    # accepted, not acted on (IGNORED says why)
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    truncation: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    max_tool_calls: Annotated[int, Meta(ge=1)] | None = None
    moderation: dict[str, Any] | None = None


class StrictResponsesRequest(ResponsesRequest, kw_only=True, forbid_unknown_fields=True):
    pass


IGNORED: dict[str, str] = {
    "store": "Nothing is stored (stateless): the response says `store: false`.",
    "metadata": "Tags for stored responses; nothing is stored.",
    "user": "An end-user id for OpenAI's abuse monitoring; nothing here monitors users.",
    "safety_identifier": "Same purpose as `user`; no abuse monitoring here.",
    "service_tier": "OpenAI's paid processing tiers; every request here is served alike.",
    "truncation": "Only `disabled` behaviour: a prompt that does not fit is a 400.",
    "prompt_cache_key": "The KV router finds shared prefixes from the tokens.",
    "prompt_cache_retention": "Workers evict cached prefixes by LRU.",
    "prompt_cache_options": "Prefix caching is always on here.",
    "stream_options": "`include_obfuscation` pads events against side channels; not needed here.",
    "max_tool_calls": "One model turn makes the calls it makes; there are no hosted tools here.",
    "moderation": "OpenAI's hosted moderation; there is none here.",
    "reasoning.summary": "Reasoning is returned whole as `reasoning_text`, never summarized.",
    "text.verbosity": "OpenAI's answer-length hint; open models have no such control.",
    "include": f"Only `{LOGPROBS_INCLUDE}` has an effect here.",
}
"""Responses request fields accepted but not acted on, with the reason."""

_DECODERS: Decoders[ResponsesRequest] = Decoders(
    StrictResponsesRequest, ResponsesRequest, "Responses request"
)


# --- input items ---------------------------------------------------------------------------------


class _Part(msgspec.Struct, kw_only=True, tag_field="type"):
    pass


class InputText(_Part, tag="input_text"):
    text: str


class OutputText(_Part, tag="output_text"):
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(_Part, tag="refusal"):
    refusal: str


Part = InputText | OutputText | Refusal


class MessageItem(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    type: Literal["message"] = "message"
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(msgspec.Struct, kw_only=True):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(msgspec.Struct, kw_only=True):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[Part]
    id: str | None = None
    status: str | None = None


class ReasoningText(msgspec.Struct, kw_only=True):
    text: str
    type: str = ""


class ReasoningItem(msgspec.Struct, kw_only=True):
    type: Literal["reasoning"]
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    id: str | None = None
    encrypted_content: str | None = None
    status: str | None = None


_ITEMS: dict[str, type[msgspec.Struct]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


# --- entry points --------------------------------------------------------------------------------


def parse_responses(body: bytes, *, allow_unknown: bool = False) -> ResponsesRequest:
    """Decode and check a ``/v1/responses`` body."""
    request = _DECODERS.decode(body, allow_unknown=allow_unknown)
    if not request.model:
        raise InvalidRequest("`model` must not be empty.", param="model")
    if request.previous_response_id is not None:
        raise InvalidRequest(
            "`previous_response_id` is not supported: this server is stateless and stores no "
            "responses. Send the whole conversation in `input` instead.",
            param="previous_response_id",
        )
    if request.conversation is not None:
        raise InvalidRequest(
            "`conversation` is not supported: this server is stateless. Send the whole "
            "conversation in `input` instead.",
            param="conversation",
        )
    if request.background:
        raise InvalidRequest(
            "`background` is not supported: responses are not stored.", param="background"
        )
    if isinstance(request.input, str) and not request.input:
        raise InvalidRequest("`input` must not be empty.", param="input")
    if isinstance(request.input, list) and not request.input:
        raise InvalidRequest("`input` must contain at least one item.", param="input")
    for i, tool in enumerate(request.tools or ()):
        if tool.type != "function":
            raise InvalidRequest(
                f"Tool type `{tool.type}` is not available here; only `function` tools are.",
                param=f"tools[{i}].type",
            )
        if tool.name is None:
            raise InvalidRequest("Function tools need a `name`.", param=f"tools[{i}].name")
    choice = request.tool_choice
    if isinstance(choice, FunctionChoice) and (choice.type != "function" or choice.name is None):
        raise InvalidRequest(
            '`tool_choice` must be `none`, `auto`, `required` or `{"type": "function", '
            '"name": ...}`.',
            param="tool_choice",
        )
    text_format = request.text.format if request.text is not None else None
    if (
        text_format is not None
        and text_format.type == "json_schema"
        and (text_format.name is None or text_format.schema is None)
    ):
        raise InvalidRequest(
            "`text.format` `json_schema` needs `name` and `schema`.", param="text.format"
        )
    _messages(request)  # every item checked before anything runs
    return request


def to_chat(request: ResponsesRequest) -> ChatCompletionRequest:
    """The equivalent chat request, checked as a chat body is (tools, ``tool_choice``…)."""
    return chat_from(chat_fields(request))


def responses_to_preprocess(
    chat: ChatCompletionRequest,
    *,
    echo: dict[str, Any] | None = None,
    request_id: str,
    reply_to: str,
    created: int,
    deadline_ms: int = 0,
    headers: RoutingHeaders = NO_HEADERS,
) -> Preprocess:
    """The bus form of a Responses request (as ``to_chat`` made it): ``format="responses"``,
    and ``echo`` (``echo_fields``) for the formatter to repeat in the ``response`` object."""
    preprocess = chat_to_preprocess(
        chat,
        request_id=request_id,
        reply_to=reply_to,
        created=created,
        deadline_ms=deadline_ms,
        headers=headers,
    )
    fields: dict[str, Any] = {"format": "responses"}
    if echo is not None:
        fields["response_fields"] = echo
    output = msgspec.structs.replace(preprocess.output, **fields)
    return msgspec.structs.replace(preprocess, output=output)


def chat_fields(request: ResponsesRequest) -> dict[str, Any]:
    """The OpenAI chat request equivalent to ``request`` (as values for ``chat_from``)."""
    fields: dict[str, Any] = {"model": request.model, "messages": _messages(request)}
    if request.tools:
        fields["tools"] = [_tool(t) for t in request.tools]
    choice = request.tool_choice
    if choice is not None:
        fields["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice.name}}
        )
    for name in (
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "stream",
    ):
        value = getattr(request, name)
        if value is not None:
            fields[name] = value
    if request.max_output_tokens is not None:
        fields["max_tokens"] = request.max_output_tokens
    if request.top_logprobs is not None or LOGPROBS_INCLUDE in (request.include or ()):
        fields["logprobs"] = True
        fields["top_logprobs"] = request.top_logprobs or 0
    effort = request.reasoning.effort if request.reasoning is not None else None
    if effort is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": effort != "none"}
    text_format = request.text.format if request.text is not None else None
    if text_format is not None and text_format.type == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif text_format is not None and text_format.type == "json_schema":
        schema: dict[str, Any] = {"name": text_format.name, "schema": text_format.schema}
        if text_format.strict is not None:
            schema["strict"] = text_format.strict
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    return fields


def echo_fields(request: ResponsesRequest) -> dict[str, Any]:
    """The request parameters a ``response`` object repeats, as OpenAI shows them (defaults
    filled in; ``store`` is always ``false``: nothing is stored). The OpenResponses schema
    requires every one of them, those not acted on (``safety_identifier``, ``prompt_cache_key``)
    included."""
    reasoning = request.reasoning
    text = request.text
    choice = request.tool_choice
    return {
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "parallel_tool_calls": _default(request.parallel_tool_calls, True),
        "presence_penalty": _default(request.presence_penalty, 0.0),
        "frequency_penalty": _default(request.frequency_penalty, 0.0),
        "prompt_cache_key": request.prompt_cache_key,
        "reasoning": {
            "effort": reasoning.effort if reasoning is not None else None,
            "summary": reasoning.summary if reasoning is not None else None,
        },
        "safety_identifier": request.safety_identifier,
        "store": False,
        "temperature": _default(request.temperature, 1.0),
        "text": {
            "format": msgspec.to_builtins(text.format)
            if text is not None and text.format is not None
            else {"type": "text"},
            "verbosity": (text.verbosity if text is not None else None) or "medium",
        },
        "tool_choice": "auto" if choice is None else msgspec.to_builtins(choice),
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": _default(t.strict, True),
            }
            for t in request.tools or ()
        ],
        "top_logprobs": request.top_logprobs or 0,
        "top_p": _default(request.top_p, 1.0),
        "truncation": request.truncation or "disabled",
        "user": request.user,
        "metadata": request.metadata or {},
    }


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


# --- helpers -------------------------------------------------------------------------------------


def _tool(tool: FunctionTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        out.append({"role": "user", "content": request.input})
        return out
    reasoning: list[str] = []
    for i, raw in enumerate(request.input):
        item = _item(i, raw)
        if isinstance(item, MessageItem):
            message: dict[str, Any] = {"role": item.role, "content": _text(item.content)}
            if item.role == "assistant" and reasoning:
                message["reasoning_content"] = "".join(reasoning)
                reasoning = []
            out.append(message)
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and not reasoning:
                last.setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning:
                    message["reasoning_content"] = "".join(reasoning)
                    reasoning = []
                out.append(message)
        elif isinstance(item, FunctionCallOutputItem):
            output = item.output
            text = output if isinstance(output, str) else _text(output)
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
        elif isinstance(item, ReasoningItem):
            parts = item.content if item.content else item.summary
            reasoning.extend(p.text for p in parts)
    if not any(m["role"] != "system" for m in out):
        raise InvalidRequest("`input` holds no message.", param="input")
    return out


def _item(index: int, raw: dict[str, Any]) -> msgspec.Struct:
    kind = raw.get("type", "message")
    struct = _ITEMS.get(kind) if isinstance(kind, str) else None
    if struct is None:
        raise InvalidRequest(
            f"Input items of type `{kind}` are not supported here (only `message`, "
            "`function_call`, `function_call_output` and `reasoning`; nothing is stored, so "
            "`item_reference` cannot be resolved).",
            param=f"input[{index}].type",
        )
    try:
        return msgspec.convert(raw, struct)
    except msgspec.ValidationError as exc:
        raise invalid(str(exc), prefix=f"input[{index}]") from None


def _text(content: str | list[Part]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.refusal if isinstance(p, Refusal) else p.text for p in content)
