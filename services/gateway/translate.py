"""Pure: OpenAI request bytes -> validated Struct -> ``shared.messages.Preprocess``.

Every way a body can be wrong ends as ``InvalidRequest`` (HTTP 400) with ``param`` naming the
offending field, never as a 500.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from services.gateway.openai_types import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)
from shared.errors import InvalidRequest
from shared.messages import (
    KServeOutput,
    OutputFormat,
    OutputOptions,
    Preprocess,
    RoutingHints,
    SamplingParams,
)
from shared.subjects import is_token

T = TypeVar("T")

MAX_STOP_SEQUENCES = 4
"""As OpenAI (and Dynamo's validator): at most four stop strings."""

_CHAT_DECODER = msgspec.json.Decoder(ChatCompletionRequest)
_COMPLETION_DECODER = msgspec.json.Decoder(CompletionRequest)
_AT_PATH = re.compile(r"^(?P<detail>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})

TENANT_HEADER = b"x-tenant-id"
WORKER_HEADER = b"x-worker-instance-id"
EXTRA_FIELDS = frozenset({"worker_id"})
"""``nvext.extra_fields`` values served; others are ignored (as Dynamo ignores unknown ones)."""
MAX_SALT_LEN = 256


@dataclass(frozen=True, slots=True)
class RoutingHeaders:
    """The routing headers of one HTTP request (``x-tenant-id``, ``x-worker-instance-id``)."""

    tenant_id: str | None = None
    worker_instance_id: str | None = None


NO_HEADERS = RoutingHeaders()


def routing_headers(headers: Iterable[tuple[bytes, bytes]]) -> RoutingHeaders:
    """Pick the routing headers out of raw ASGI headers (names are lower-case there)."""
    tenant = worker = None
    for name, value in headers:
        if name == TENANT_HEADER:
            tenant = value.decode("latin-1").strip() or None
        elif name == WORKER_HEADER:
            worker = value.decode("latin-1").strip() or None
    if tenant is None and worker is None:
        return NO_HEADERS
    return RoutingHeaders(tenant_id=tenant, worker_instance_id=worker)


def parse_chat(body: bytes) -> ChatCompletionRequest:
    """Decode and validate a chat completion body."""
    request = _decode(_CHAT_DECODER, body)
    _check_common(request)
    if not request.messages:
        raise InvalidRequest("`messages` must contain at least one message.", param="messages")
    return request


def parse_completion(body: bytes) -> CompletionRequest:
    """Decode and validate a completion body."""
    request = _decode(_COMPLETION_DECODER, body)
    _check_common(request)
    return request


def completion_from(fields: dict[str, Any]) -> CompletionRequest:
    """Validate a completion request given as values (the gRPC front end), as a body would be."""
    try:
        request = msgspec.convert(fields, CompletionRequest)
    except msgspec.ValidationError as exc:
        raise _invalid(str(exc)) from None
    _check_common(request)
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
    routing, worker_id = _routing(request, headers)
    tools = None
    if request.tools and request.tool_choice != "none":
        tools = tuple(request.tools)
    max_tokens = request.max_completion_tokens or request.max_tokens
    return Preprocess(
        request_id=request_id,
        api="chat",
        model=request.model,
        reply_to=reply_to,
        created=created,
        messages=tuple(_message_dict(i, m) for i, m in enumerate(request.messages)),
        tools=tools,
        chat_template_kwargs=request.chat_template_kwargs or {},
        add_generation_prompt=_flag(request.add_generation_prompt, default=True),
        continue_final_message=_flag(request.continue_final_message, default=False),
        max_tokens=max_tokens,
        sampling=_sampling(request, max_tokens),
        output=_output(request, echo=False),
        deadline_ms=deadline_ms,
        routing=routing,
        worker_id=worker_id,
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
    routing, worker_id = _routing(request, headers)
    prompt, token_ids = _prompt(request.prompt)
    return Preprocess(
        request_id=request_id,
        api="completion",
        model=request.model,
        reply_to=reply_to,
        created=created,
        prompt=prompt,
        prompt_token_ids=token_ids,
        max_tokens=request.max_tokens,
        sampling=_sampling(request, request.max_tokens),
        output=_output(
            request, echo=_flag(request.echo, default=False), fmt=output_format, kserve=kserve
        ),
        deadline_ms=deadline_ms,
        routing=routing,
        worker_id=worker_id,
    )


# --- helpers -------------------------------------------------------------------------------------


def _decode(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _invalid(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None


def _invalid(error: str) -> InvalidRequest:
    """Turn msgspec's ``"<detail> - at `$.a[0].b`"`` into a message and an OpenAI ``param``."""
    match = _AT_PATH.match(error)
    detail = match["detail"] if match else error
    param = (match["path"] or "").lstrip(".") if match else ""
    if missing := _MISSING.match(detail):
        param = f"{param}.{missing['field']}" if param else missing["field"]
    if not param:
        return InvalidRequest(f"Invalid request body: {detail}")
    return InvalidRequest(f"Invalid value for `{param}`: {detail}", param=param)


def _check_common(request: ChatCompletionRequest | CompletionRequest) -> None:
    if not request.model:
        raise InvalidRequest("`model` must not be empty.", param="model")
    if request.n is not None and request.n != 1:
        raise InvalidRequest("Only `n=1` is supported.", param="n")
    if request.logprobs:
        raise InvalidRequest("`logprobs` is not supported.", param="logprobs")
    stop = request.stop
    if isinstance(stop, list):
        if len(stop) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(
                f"`stop` may hold at most {MAX_STOP_SEQUENCES} sequences.", param="stop"
            )
        if not all(stop):
            raise InvalidRequest("`stop` sequences must not be empty.", param="stop")


def _flag(value: bool | None, *, default: bool) -> bool:
    return default if value is None else value


def _message_dict(index: int, message: ChatMessage) -> dict[str, Any]:
    """A message as the chat template sees it: role, text content, and the tool/reasoning keys."""
    content = message.content
    if isinstance(content, list):
        content = _join_text_parts(index, content)
    elif content is None and message.role in _CONTENT_REQUIRED:
        raise InvalidRequest(
            f"Messages with role `{message.role}` need `content`.",
            param=f"messages[{index}].content",
        )
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls is not None:
        out["tool_calls"] = message.tool_calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    return out


def _join_text_parts(index: int, parts: list[Any]) -> str:
    texts: list[str] = []
    for j, part in enumerate(parts):
        if part.type != "text" or part.text is None:
            raise InvalidRequest(
                'Only text content parts (`{"type": "text", "text": ...}`) are supported.',
                param=f"messages[{index}].content[{j}]",
            )
        texts.append(part.text)
    # vLLM joins text parts with a newline when it flattens content to a string.
    return "\n".join(texts)


def _prompt(prompt: str | list[Any]) -> tuple[str | None, tuple[int, ...] | None]:
    """``(prompt, None)`` or ``(None, token_ids)``; batches of several prompts are refused."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("`prompt` must not be empty.", param="prompt")
        return prompt, None
    if len(prompt) == 1 and isinstance(prompt[0], str | list):
        return _prompt(prompt[0])
    if prompt and all(type(t) is int and t >= 0 for t in prompt):
        return None, tuple(prompt)
    if len(prompt) > 1 and all(isinstance(p, str | list) for p in prompt):
        raise InvalidRequest("Only one prompt per request is supported.", param="prompt")
    raise InvalidRequest(
        "`prompt` must be a string, a list with one string, or a list of token ids.",
        param="prompt",
    )


def _sampling(
    request: ChatCompletionRequest | CompletionRequest, max_tokens: int | None
) -> SamplingParams:
    defaults = _DEFAULT_SAMPLING
    top_k = request.top_k
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
    )


def _output(
    request: ChatCompletionRequest | CompletionRequest,
    *,
    echo: bool,
    fmt: OutputFormat = "openai",
    kserve: KServeOutput | None = None,
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
        extra_fields=_extra_fields(request),
        format=fmt,
        kserve=kserve,
    )


def _extra_fields(request: ChatCompletionRequest | CompletionRequest) -> tuple[str, ...]:
    nvext = request.nvext
    if nvext is None or not nvext.extra_fields:
        return ()
    return tuple(sorted(EXTRA_FIELDS.intersection(nvext.extra_fields)))


def _routing(
    request: ChatCompletionRequest | CompletionRequest, headers: RoutingHeaders
) -> tuple[RoutingHints | None, str | None]:
    """``Preprocess.routing`` and ``Preprocess.worker_id`` from ``nvext``, body and headers.

    ``cache_salt`` (body) wins over ``x-tenant-id``; a pinned worker comes from
    ``nvext.backend_instance_id`` or ``x-worker-instance-id`` (both given must agree).
    """
    nvext = request.nvext
    pinned = nvext.backend_instance_id if nvext is not None else None
    worker_id = _pinned_worker(None if pinned is None else str(pinned), headers.worker_instance_id)
    salt = request.cache_salt
    if salt is None and headers.tenant_id is not None:
        if len(headers.tenant_id) > MAX_SALT_LEN:
            raise InvalidRequest(
                f"`x-tenant-id` may be at most {MAX_SALT_LEN} characters.", param="x-tenant-id"
            )
        salt = headers.tenant_id
    weight = nvext.overlap_score_weight if nvext is not None else None
    temperature = nvext.router_temperature if nvext is not None else None
    if salt is None and weight is None and temperature is None:
        return None, worker_id
    hints = RoutingHints(
        overlap_score_weight=weight, router_temperature=temperature, cache_salt=salt
    )
    return hints, worker_id


def _pinned_worker(from_body: str | None, from_header: str | None) -> str | None:
    for value, param in (
        (from_body, "nvext.backend_instance_id"),
        (from_header, "x-worker-instance-id"),
    ):
        if value is not None and not is_token(value):
            raise InvalidRequest(
                f"`{param}` must be a worker id (letters, digits, `_` and `-`).", param=param
            )
    if from_body is not None and from_header is not None and from_body != from_header:
        raise InvalidRequest(
            "`nvext.backend_instance_id` and `x-worker-instance-id` name different workers.",
            param="nvext.backend_instance_id",
        )
    return from_body or from_header


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


_DEFAULT_SAMPLING = SamplingParams()
