"""The inference endpoints ``Relay`` serves: path, how a body becomes a ``Preprocess``, and the
API's error dialect. Pure.

Every endpoint parses its body (``allow_unknown``: ``--allow-unknown-fields``) into ``Parsed``:
the model to check and a function that makes the bus request once the request id, reply subject
and deadline are known (for the Responses API, once the conversation it continues is read:
``Parsed.turn``, ``core/turns.py``). ``generate`` endpoints answer with the formatter's bytes
(a JSON body or an SSE stream); ``count_tokens`` asks the preprocessors how many prompt tokens
the request makes and answers ``{"input_tokens": N}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from msgspec.structs import replace

from services.gateway.apis import anthropic as anthropic_api
from services.gateway.apis.anthropic import (
    messages_to_preprocess,
    parse_count_tokens,
    parse_messages,
)
from services.gateway.apis.nvext import RoutingHeaders
from services.gateway.apis.openai import (
    chat_to_preprocess,
    completion_to_preprocess,
    parse_chat,
    parse_completion,
    prompts,
)
from services.gateway.apis.openai_responses_api import ResponsesRequest, parse_responses
from services.gateway.core.paths import Paths
from services.gateway.http.error_dialects import ANTHROPIC, OPENAI, RESPONSES, ErrorDialect
from shared.messages import Preprocess


@dataclass(frozen=True, slots=True)
class Parsed:
    """A checked request: its model, and how to make its bus form.

    ``to_preprocess(request_id=, reply_to=, created=, deadline_ms=)`` -> ``Preprocess``.
    """

    model: str
    to_preprocess: Callable[..., Preprocess]
    turn: ResponsesRequest | None = None
    """A Responses turn: its bus form is made by ``Turns.begin`` (``to_preprocess`` unused)."""
    batch: tuple[Callable[..., Preprocess], ...] = ()
    """Completions with several prompts: one bus request each (``to_preprocess`` unused)."""
    choices: int = 1
    """A batch's choices per prompt (``n``)."""


Parse = Callable[[bytes, RoutingHeaders, bool], Parsed]
"""``(body, routing headers, allow_unknown) -> Parsed``; raises ``InvalidRequest``."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str
    parse: Parse
    dialect: ErrorDialect = OPENAI
    kind: Literal["generate", "count_tokens"] = "generate"


def _chat(body: bytes, headers: RoutingHeaders, allow_unknown: bool) -> Parsed:
    request = parse_chat(body, allow_unknown=allow_unknown)
    return Parsed(request.model, partial(chat_to_preprocess, request, headers=headers))


def _completion(body: bytes, headers: RoutingHeaders, allow_unknown: bool) -> Parsed:
    request = parse_completion(body, allow_unknown=allow_unknown)
    batch = prompts(request.prompt)
    if len(batch) == 1:
        return Parsed(request.model, partial(completion_to_preprocess, request, headers=headers))
    each = tuple(
        partial(completion_to_preprocess, replace(request, prompt=prompt), headers=headers)
        for prompt in batch
    )
    return Parsed(request.model, _unbound, batch=each, choices=request.n or 1)


def _messages(body: bytes, headers: RoutingHeaders, allow_unknown: bool) -> Parsed:
    request = parse_messages(body, allow_unknown=allow_unknown)
    converted = anthropic_api.to_chat(request)
    return Parsed(request.model, partial(messages_to_preprocess, converted, headers=headers))


def _count_tokens(body: bytes, headers: RoutingHeaders, allow_unknown: bool) -> Parsed:
    request = parse_count_tokens(body, allow_unknown=allow_unknown)
    converted = anthropic_api.to_chat(request)
    return Parsed(request.model, partial(messages_to_preprocess, converted, headers=headers))


def _responses(body: bytes, headers: RoutingHeaders, allow_unknown: bool) -> Parsed:
    request = parse_responses(body, allow_unknown=allow_unknown)
    return Parsed(request.model, _unbound, turn=request)


def _unbound(**_: object) -> Preprocess:
    raise AssertionError("made by Turns.begin, or one per prompt (Parsed.batch)")


def endpoints(paths: Paths) -> dict[str, Endpoint]:
    """Path -> endpoint, for every path ``Relay`` serves (any method: only ``POST`` is allowed)."""
    return {
        e.path: e
        for e in (
            Endpoint(paths.chat, _chat),
            Endpoint(paths.completions, _completion),
            Endpoint(paths.messages, _messages, ANTHROPIC),
            Endpoint(paths.count_tokens, _count_tokens, ANTHROPIC, kind="count_tokens"),
            Endpoint(paths.responses, _responses, RESPONSES),
        )
    }
