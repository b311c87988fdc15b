"""Pure: OpenAI request bytes -> validated Struct -> ``shared.messages.Preprocess``.

Every way a body can be wrong ends as ``InvalidRequest`` (HTTP 400) with ``param`` naming the
offending field, never as a 500. Unknown top-level fields are refused, naming them, unless the
caller passes ``allow_unknown=True`` (``--allow-unknown-fields``): then they are ignored and
logged. Tools and structured outputs are resolved by ``tooling``, ``nvext`` and the routing
headers by ``nvext``; what is accepted but not acted on is listed in ``accepted_fields``.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
import structlog

from services.gateway.apis import nvext as nv
from services.gateway.apis import tooling
from services.gateway.apis.accepted_fields import NVEXT_EXTRA_FIELDS as EXTRA_FIELDS
from services.gateway.apis.bodies import Decoders, UnknownField, invalid
from services.gateway.apis.nvext import (
    MAX_SALT_LEN,
    NO_HEADERS,
    TENANT_HEADER,
    WORKER_HEADER,
    RoutingHeaders,
    routing_headers,
)
from services.gateway.apis.openai_types import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ResponseFormatJsonSchema,
    StrictChatCompletionRequest,
    StrictCompletionRequest,
)
from shared.errors import InvalidRequest
from shared.messages import (
    Guided,
    KServeOutput,
    OutputFormat,
    OutputOptions,
    Preprocess,
    SamplingParams,
)

__all__ = [
    "EXTRA_FIELDS",
    "MAX_SALT_LEN",
    "NO_HEADERS",
    "TENANT_HEADER",
    "WORKER_HEADER",
    "RoutingHeaders",
    "UnknownField",
    "chat_from",
    "chat_to_preprocess",
    "completion_from",
    "completion_to_preprocess",
    "parse_chat",
    "parse_completion",
    "routing_headers",
]

S = TypeVar("S", bound=msgspec.Struct)
log = structlog.get_logger(__name__)

MAX_STOP_SEQUENCES = 4
"""As OpenAI (and Dynamo's validator): at most four stop strings."""

_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})
_INT_MIN, _UINT_MAX = -(2**63), 2**64 - 1
"""MessagePack's integer range."""


_CHAT: Decoders[ChatCompletionRequest] = Decoders(
    StrictChatCompletionRequest, ChatCompletionRequest, "chat completion request"
)
_COMPLETION: Decoders[CompletionRequest] = Decoders(
    StrictCompletionRequest, CompletionRequest, "completion request"
)


def parse_chat(body: bytes, *, allow_unknown: bool = False) -> ChatCompletionRequest:
    """Decode and validate a chat completion body (unknown fields: 400 unless allowed)."""
    request = _decode(_CHAT, body, allow_unknown)
    _check_chat(request)
    return request


def parse_completion(body: bytes, *, allow_unknown: bool = False) -> CompletionRequest:
    """Decode and validate a completion body (unknown fields: 400 unless allowed)."""
    request = _decode(_COMPLETION, body, allow_unknown)
    _check_completion(request)
    return request


def chat_from(fields: dict[str, Any]) -> ChatCompletionRequest:
    """Validate a chat request given as values (another front end: Responses, Messages) as a
    body would be; unknown keys are the caller's business and are ignored."""
    try:
        request = msgspec.convert(fields, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        raise invalid(str(exc)) from None
    _check_chat(request)
    return request


def completion_from(fields: dict[str, Any]) -> CompletionRequest:
    """Validate a completion request given as values (the gRPC front end), as a body would be."""
    try:
        request = msgspec.convert(fields, CompletionRequest)
    except msgspec.ValidationError as exc:
        raise invalid(str(exc)) from None
    _check_completion(request)
    return request


def chat_to_preprocess(
    request: ChatCompletionRequest,
    *,
    request_id: str,
    reply_to: str,
    created: int,
    deadline_ms: int = 0,
    headers: RoutingHeaders = NO_HEADERS,
) -> Preprocess:
    """The bus form of a validated chat request."""
    routing, worker_id = nv.routing(request.nvext, request.cache_salt, headers)
    ext = request.nvext
    tools = tooling.resolve(request)
    max_thinking = ext.max_thinking_tokens if ext is not None else None
    max_tokens = request.max_completion_tokens or request.max_tokens
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    token_data = ext.token_data if ext is not None else None
    return Preprocess(
        request_id=request_id,
        api="chat",
        model=request.model,
        reply_to=reply_to,
        created=created,
        messages=tuple(_message_dict(i, m) for i, m in enumerate(request.messages)),
        prompt_token_ids=tuple(token_data) if token_data else None,
        tools=tooling.template_tools(tools),
        chat_template_kwargs=request.chat_template_kwargs or {},
        add_generation_prompt=_flag(request.add_generation_prompt, default=True),
        continue_final_message=_flag(request.continue_final_message, default=False),
        max_tokens=max_tokens,
        sampling=_sampling(
            request, max_tokens, logprobs, tooling.guided(request, tools, max_thinking)
        ),
        output=_output(
            request,
            logprobs,
            echo=False,
            legacy_functions=request.functions is not None,
            parallel_tool_calls=tools.parallel or not tools.active,
        ),
        deadline_ms=deadline_ms,
        routing=routing,
        worker_id=worker_id,
        use_raw_prompt=bool(ext is not None and ext.use_raw_prompt),
    )


def completion_to_preprocess(
    request: CompletionRequest,
    *,
    request_id: str,
    reply_to: str,
    created: int,
    deadline_ms: int = 0,
    headers: RoutingHeaders = NO_HEADERS,
    output_format: OutputFormat = "openai",
    kserve: KServeOutput | None = None,
) -> Preprocess:
    """The bus form of a validated completion request (``text`` or ``kserve`` output for
    gRPC)."""
    routing, worker_id = nv.routing(request.nvext, request.cache_salt, headers)
    ext = request.nvext
    prompt, token_ids = _prompt(request.prompt)
    if ext is not None and ext.token_data:
        prompt, token_ids = None, tuple(ext.token_data)
    guided = None
    if ext is not None and ext.max_thinking_tokens is not None:
        guided = tooling.guided_thinking(ext.max_thinking_tokens)
    return Preprocess(
        request_id=request_id,
        api="completion",
        model=request.model,
        reply_to=reply_to,
        created=created,
        prompt=prompt,
        prompt_token_ids=token_ids,
        max_tokens=request.max_tokens,
        sampling=_sampling(request, request.max_tokens, request.logprobs, guided),
        output=_output(
            request,
            request.logprobs,
            echo=_flag(request.echo, default=False),
            fmt=output_format,
            kserve=kserve,
        ),
        deadline_ms=deadline_ms,
        routing=routing,
        worker_id=worker_id,
        use_raw_prompt=bool(ext is not None and ext.use_raw_prompt),
    )


# --- decoding ------------------------------------------------------------------------------------


def _decode(decoders: Decoders[S], body: bytes, allow_unknown: bool) -> S:
    return decoders.decode(body, allow_unknown=allow_unknown)


# --- checks --------------------------------------------------------------------------------------


def _check_chat(request: ChatCompletionRequest) -> None:
    _check_common(request)
    if not request.messages:
        raise InvalidRequest("`messages` must contain at least one message.", param="messages")
    if request.top_logprobs is not None and not request.logprobs:
        raise InvalidRequest("`top_logprobs` needs `logprobs: true`.", param="top_logprobs")
    if request.audio is not None or (request.modalities and "audio" in request.modalities):
        param = "audio" if request.audio is not None else "modalities"
        raise InvalidRequest("Audio output is not supported; only text.", param=param)
    tooling.resolve(request)
    _check_free_form(request)


def _check_free_form(request: ChatCompletionRequest) -> None:
    """Free-form JSON that goes on the bus (MessagePack) must hold 64-bit integers only."""
    values: list[tuple[Any, str]] = [(request.chat_template_kwargs, "chat_template_kwargs")]
    for i, message in enumerate(request.messages):
        values.append((message.tool_calls, f"messages[{i}].tool_calls"))
        values.append((message.function_call, f"messages[{i}].function_call"))
    for i, tool in enumerate(request.tools or ()):
        values.append((tool.function.parameters, f"tools[{i}].function.parameters"))
    for i, function in enumerate(request.functions or ()):
        values.append((function.parameters, f"functions[{i}].parameters"))
    fmt = request.response_format
    if isinstance(fmt, ResponseFormatJsonSchema):
        values.append((fmt.json_schema.schema, "response_format.json_schema.schema"))
    for value, param in values:
        if value is not None and not _fits_64_bits(value):
            raise InvalidRequest(
                f"`{param}` holds an integer that does not fit in 64 bits.", param=param
            )


def _fits_64_bits(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return _INT_MIN <= value <= _UINT_MAX
    if isinstance(value, dict):
        return all(_fits_64_bits(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_fits_64_bits(v) for v in value)
    return True


def _check_completion(request: CompletionRequest) -> None:
    _check_common(request)
    batch = prompts(request.prompt)
    if len(batch) > MAX_PROMPTS:
        raise InvalidRequest(
            f"At most {MAX_PROMPTS} prompts in one request (got {len(batch)}).", param="prompt"
        )
    for i, prompt in enumerate(batch):
        _prompt(prompt, "prompt" if len(batch) == 1 else f"prompt[{i}]")
    n = request.n or 1
    if request.best_of is not None and request.best_of != n:
        raise InvalidRequest(
            f"`best_of` is not supported (the server does not pick the best of several "
            f"sequences); leave it null or equal to `n` ({n}), and ask for `n` choices instead.",
            param="best_of",
        )
    if request.suffix:
        raise InvalidRequest(
            "`suffix` is not supported (no insertion / fill-in-the-middle).", param="suffix"
        )


def _check_common(request: ChatCompletionRequest | CompletionRequest) -> None:
    if not request.model:
        raise InvalidRequest("`model` must not be empty.", param="model")
    stop = request.stop
    if isinstance(stop, list):
        if len(stop) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(
                f"`stop` may hold at most {MAX_STOP_SEQUENCES} sequences.", param="stop"
            )
        if not all(stop):
            raise InvalidRequest("`stop` sequences must not be empty.", param="stop")
    if request.logit_bias:
        for key in request.logit_bias:
            if not (key.isascii() and key.isdigit() and int(key) < 2**32):
                raise InvalidRequest(
                    f"`logit_bias` keys must be token ids (digits); got {key!r}.",
                    param="logit_bias",
                )
    # The routing inputs are checked here too, so a bad one is refused before anything runs.
    nv.routing(request.nvext, request.cache_salt, NO_HEADERS)


# --- mapping -------------------------------------------------------------------------------------


def _flag(value: bool | None, *, default: bool) -> bool:
    return default if value is None else value


def _message_dict(index: int, message: ChatMessage) -> dict[str, Any]:
    """A message as the chat template sees it: role, text content, and the tool/reasoning keys."""
    content: Any = message.content
    if isinstance(content, list):
        content = _content_parts(index, content)
    elif content is None and message.role in _CONTENT_REQUIRED:
        raise InvalidRequest(
            f"Messages with role `{message.role}` need `content`.",
            param=f"messages[{index}].content",
        )
    # A deprecated `function` result is a tool result to the template (templates know `tool`).
    role = "tool" if message.role == "function" else message.role
    out: dict[str, Any] = {"role": role, "content": content}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls is not None:
        out["tool_calls"] = message.tool_calls
    elif message.function_call is not None:
        out["tool_calls"] = [{"type": "function", "function": message.function_call}]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    return out


def _content_parts(index: int, parts: list[Any]) -> str | list[dict[str, Any]]:
    """Text parts joined into one string; with images, the parts as the preprocessor reads
    them (``image_url`` parts carry the ``param`` naming them, decision 032)."""
    texts: list[str] = []
    out: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        param = part.param or f"messages[{index}].content[{j}]"
        if part.type == "image_url" and part.image_url is not None and part.image_url.url:
            out.append(
                {"type": "image_url", "image_url": {"url": part.image_url.url}, "param": param}
            )
        elif part.type == "text" and part.text is not None:
            texts.append(part.text)
            out.append({"type": "text", "text": part.text})
        else:
            raise InvalidRequest(
                f"`{param}`: only `text` and `image_url` content parts are supported "
                f"(got `{part.type}`).",
                param=param,
            )
    # vLLM joins text parts with a newline when it flattens content to a string.
    return out if len(out) > len(texts) else "\n".join(texts)


MAX_PROMPTS = 128
"""Prompts in one completions request (each is a request on the bus, ``prompt_batches``)."""


def prompts(prompt: str | list[Any]) -> list[Any]:
    """The prompts of a completions request: one, or each of a list of several strings or
    token-id lists (a batch, answered as one: ``apis/prompt_batches.py``)."""
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, list) for p in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return [prompt]


def _prompt(
    prompt: str | list[Any], param: str = "prompt"
) -> tuple[str | None, tuple[int, ...] | None]:
    """``(prompt, None)`` or ``(None, token_ids)`` of one prompt (``prompts`` splits a batch)."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest(f"`{param}` must not be empty.", param=param)
        return prompt, None
    if len(prompt) == 1 and isinstance(prompt[0], str | list):
        return _prompt(prompt[0], param)
    if prompt and all(type(t) is int and 0 <= t < 2**32 for t in prompt):
        return None, tuple(prompt)
    raise InvalidRequest(
        f"`{param}` must be a string, a list of token ids, or a list of several strings or of "
        "several token-id lists.",
        param=param,
    )


def _sampling(
    request: ChatCompletionRequest | CompletionRequest,
    max_tokens: int | None,
    logprobs: int | None,
    guided: Guided | None,
) -> SamplingParams:
    defaults = _DEFAULT_SAMPLING
    top_k = request.top_k
    bias = request.logit_bias
    ext = request.nvext
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else defaults.max_tokens,
        min_tokens=request.min_tokens or 0,
        temperature=_or(request.temperature, defaults.temperature),
        top_p=_or(request.top_p, defaults.top_p),
        # vLLM treats top_k 0 and -1 alike: no top-k filtering.
        top_k=top_k if top_k else -1,
        seed=request.seed,
        presence_penalty=_or(request.presence_penalty, defaults.presence_penalty),
        frequency_penalty=_or(request.frequency_penalty, defaults.frequency_penalty),
        ignore_eos=_flag(request.ignore_eos, default=False),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        n=request.n or 1,
        logprobs=logprobs,
        min_p=_or(request.min_p, defaults.min_p),
        repetition_penalty=_or(request.repetition_penalty, defaults.repetition_penalty),
        logit_bias={int(k): v for k, v in bias.items()} if bias else None,
        greedy=bool(ext is not None and ext.greed_sampling),
        guided=guided,
    )


def _output(
    request: ChatCompletionRequest | CompletionRequest,
    logprobs: int | None,
    *,
    echo: bool,
    fmt: OutputFormat = "openai",
    kserve: KServeOutput | None = None,
    legacy_functions: bool = False,
    parallel_tool_calls: bool = True,
) -> OutputOptions:
    stream = _flag(request.stream, default=False)
    options = request.stream_options
    stop = request.stop
    return OutputOptions(
        stream=stream,
        include_usage=stream and options is not None and bool(options.include_usage),
        continuous_usage=stream and options is not None and bool(options.continuous_usage_stats),
        stop=((stop,) if stop else ()) if isinstance(stop, str) else tuple(stop or ()),
        include_stop_str_in_output=_flag(request.include_stop_str_in_output, default=False),
        skip_special_tokens=_flag(request.skip_special_tokens, default=True),
        echo=echo,
        n=request.n or 1,
        extra_fields=nv.extra_fields(request.nvext),
        logprobs=logprobs,
        annotations=nv.annotation_names(request.nvext),
        legacy_functions=legacy_functions,
        parallel_tool_calls=parallel_tool_calls,
        format=fmt,
        kserve=kserve,
    )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


_DEFAULT_SAMPLING = SamplingParams()
