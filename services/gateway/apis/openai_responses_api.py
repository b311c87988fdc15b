"""Pure: OpenAI Responses request bytes -> validated Struct -> ``shared.messages.Preprocess``.

``POST /v1/responses`` on top of the chat path: the request becomes the equivalent chat request
(``translate.chat_from``), whose ``Preprocess`` asks for ``output.format="responses"``. The
mapping:

- ``instructions`` -> a ``system`` message first; ``input`` as a string -> one user message;
- the items of the turns ``previous_response_id`` continues (``history``, read from the store
  by the gateway, decision 030) come before ``input``; the earlier turns' ``instructions`` do
  not (as OpenAI: each request gives its own);
- ``input`` items: ``message`` (``input_text`` / ``output_text`` / ``refusal`` / ``input_file``
  parts; ``type`` may be left out, as the API allows) -> a message of its role; an
  ``input_file`` part becomes its text (``input_files``; text-like files only);
  ``function_call`` -> an assistant ``tool_calls`` entry (consecutive calls share one assistant
  message); ``function_call_output`` -> a ``tool`` message; ``reasoning`` -> the next assistant
  message's ``reasoning_content``; ``compaction`` (from ``/v1/responses/compact``) -> a user
  message with the summary it holds;
- ``tools`` (flat ``{"type": "function", "name", "description", "parameters"}``), ``tool_choice``
  (``none`` / ``auto`` / ``required`` / ``{"type": "function", "name"}``),
  ``parallel_tool_calls``; ``max_output_tokens`` -> ``max_tokens``; ``temperature``, ``top_p``,
  ``presence_penalty``, ``frequency_penalty``;
  ``reasoning.effort`` -> ``enable_thinking`` (``none`` turns it off); ``text.format``
  ``json_schema`` / ``json_object`` -> guided JSON; ``top_logprobs`` (or ``include`` of
  ``message.output_text.logprobs``) -> log-probabilities on the output text.

``store`` (default true, as OpenAI) keeps the turn for ``previous_response_id``, ``GET`` and
``DELETE`` (the gateway's store; the response says ``"store": true`` and carries the id the
gateway gave it, ``echo_fields``). ``conversation`` and ``background`` are refused (400), as are
``input_image`` parts (until images land, issue 27 item 3: ``_image_part``), ``item_reference``
items and OpenAI's hosted tools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from services.gateway.apis.bodies import Decoders, invalid
from services.gateway.apis.compaction import decode_summary, summary_message
from services.gateway.apis.input_files import file_text
from services.gateway.apis.nvext import NO_HEADERS, RoutingHeaders
from services.gateway.apis.openai import chat_from, chat_to_preprocess
from services.gateway.apis.openai_types import ChatCompletionRequest, Penalty
from services.gateway.apis.stored_turns import check_response_id
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
    store: bool | None = None
    """Keep the turn (default true, as OpenAI)."""
    metadata: dict[str, str] | None = None
    # accepted, not acted on (IGNORED says why)
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


class InputFile(_Part, tag="input_file"):
    file_data: str | None = None
    filename: str | None = None
    file_id: str | None = None
    file_url: str | None = None


class InputImage(_Part, tag="input_image"):
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


Part = InputText | OutputText | Refusal | InputFile | InputImage


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


class CompactionItem(msgspec.Struct, kw_only=True):
    type: Literal["compaction"]
    encrypted_content: str
    id: str | None = None
    created_by: str | None = None


_ITEMS: dict[str, type[msgspec.Struct]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
    "compaction": CompactionItem,
}


# --- entry points --------------------------------------------------------------------------------


def parse_responses(body: bytes, *, allow_unknown: bool = False) -> ResponsesRequest:
    """Decode and check a ``/v1/responses`` body."""
    request = _DECODERS.decode(body, allow_unknown=allow_unknown)
    if not request.model:
        raise InvalidRequest("`model` must not be empty.", param="model")
    if request.previous_response_id is not None:
        check_response_id(request.previous_response_id, "previous_response_id")
    if request.conversation is not None:
        raise InvalidRequest(
            "`conversation` is not supported: continue a conversation with "
            "`previous_response_id`, or send the whole conversation in `input`.",
            param="conversation",
        )
    if request.background:
        raise InvalidRequest(
            "`background` is not supported: a response is answered while its request waits.",
            param="background",
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


def is_stored(request: ResponsesRequest) -> bool:
    """Whether the turn is to be kept (``store``, true unless the request says false)."""
    return request.store is not False


def to_chat(
    request: ResponsesRequest, history: Sequence[dict[str, Any]] = ()
) -> ChatCompletionRequest:
    """The equivalent chat request, checked as a chat body is (tools, ``tool_choice``…);
    ``history``: the items of the turns it continues."""
    return chat_from(chat_fields(request, history))


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


def chat_fields(
    request: ResponsesRequest, history: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """The OpenAI chat request equivalent to ``request`` after ``history`` (as values for
    ``chat_from``)."""
    fields: dict[str, Any] = {"model": request.model, "messages": _messages(request, history)}
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


def echo_fields(
    request: ResponsesRequest, *, response_id: str | None = None, stored: bool = False
) -> dict[str, Any]:
    """The request parameters a ``response`` object repeats, as OpenAI shows them (defaults
    filled in; ``store``: whether the gateway keeps the turn). The OpenResponses schema requires
    every one of them, those not acted on (``safety_identifier``, ``prompt_cache_key``)
    included. ``response_id``: the id the gateway gave the response (else the formatter's)."""
    reasoning = request.reasoning
    text = request.text
    choice = request.tool_choice
    ids = {} if response_id is None else {"id": response_id}
    return {
        **ids,
        "previous_response_id": request.previous_response_id,
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
        "store": stored,
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


def _messages(
    request: ResponsesRequest, history: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    out += _history_messages(history)
    raw = request.input
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    out += _item_messages(items, "input")
    if not any(m["role"] != "system" for m in out):
        raise InvalidRequest("`input` holds no message.", param="input")
    return out


def _history_messages(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The earlier turns' items as chat messages (they were checked when first sent)."""
    return _item_messages(history, "previous_response_id") if history else []


def _item_messages(items: Sequence[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Input items (at ``where``, for error params) -> chat messages."""
    out: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, raw in enumerate(items):
        param = f"{where}[{i}]"
        item = _item(param, raw)
        if isinstance(item, MessageItem):
            message: dict[str, Any] = {
                "role": item.role,
                "content": _content(item.content, param),
            }
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
            text = output if isinstance(output, str) else _text(output, f"{param}.output")
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
        elif isinstance(item, ReasoningItem):
            parts = item.content if item.content else item.summary
            reasoning.extend(p.text for p in parts)
        elif isinstance(item, CompactionItem):
            summary = decode_summary(item.encrypted_content, f"{param}.encrypted_content")
            out.append(summary_message(summary))
    return out


def _item(param: str, raw: dict[str, Any]) -> msgspec.Struct:
    kind = raw.get("type", "message")
    struct = _ITEMS.get(kind) if isinstance(kind, str) else None
    if struct is None:
        raise InvalidRequest(
            f"Input items of type `{kind}` are not supported here (only `message`, "
            "`function_call`, `function_call_output`, `reasoning` and `compaction`; "
            "`item_reference` cannot be resolved: continue with `previous_response_id`).",
            param=f"{param}.type",
        )
    try:
        return msgspec.convert(raw, struct)
    except msgspec.ValidationError as exc:
        raise invalid(str(exc), prefix=param) from None


def _text(content: str | list[Part], param: str) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(_part_text(part, f"{param}.content[{j}]") for j, part in enumerate(content))


def _part_text(part: Part, param: str) -> str:
    if isinstance(part, Refusal):
        return part.refusal
    if isinstance(part, InputFile):
        return file_text(
            param=param,
            file_data=part.file_data,
            filename=part.filename,
            file_id=part.file_id,
            file_url=part.file_url,
        )
    if isinstance(part, InputImage):  # only in a message's content (``_content``)
        raise InvalidRequest(f"`{param}`: an image cannot be a tool's output.", param=param)
    return part.text


def _content(content: str | list[Part], param: str) -> str | list[dict[str, Any]]:
    """A message's content: its text, or with ``input_image`` parts the chat path's text and
    ``image_url`` parts in order (decision 032)."""
    if isinstance(content, str) or not any(isinstance(p, InputImage) for p in content):
        return _text(content, param)
    return [
        _image_part(part, f"{param}.content[{j}]")
        if isinstance(part, InputImage)
        else {"type": "text", "text": _part_text(part, f"{param}.content[{j}]")}
        for j, part in enumerate(content)
    ]


def _image_part(part: InputImage, param: str) -> dict[str, Any]:
    """An ``input_image`` as the chat path's ``image_url`` part (``file_id``: nothing is
    stored to look it up, a 400)."""
    if not part.image_url:
        raise InvalidRequest(
            f"`{param}`: an `input_image` needs `image_url` (a data: URL, or an http(s) URL "
            "where allowed); `file_id` cannot be resolved here.",
            param=param,
        )
    return {"type": "image_url", "image_url": {"url": part.image_url}, "param": param}
