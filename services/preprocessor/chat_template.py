"""Render a chat template exactly as transformers' ``apply_chat_template`` does (pure).

Messages are first normalised the way vLLM does for templates that expect string content:
text parts joined with newlines, ``None`` content as ``""``, tool-call arguments parsed to
objects; a content with images stays a list of ``{"type": "text", "text"}`` and
``{"type": "image"}`` parts, as vision templates read it (decision 032). Each template source is
compiled once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache, lru_cache
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from shared.errors import InternalError, InvalidRequest

RESERVED_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
"""Template variables that come from the request itself, never from ``chat_template_kwargs``."""
_TEXT_PART_KEYS = {"text": "text", "input_text": "text", "refusal": "refusal"}
IMAGE_PART = "image_url"
"""How an image part reaches the preprocessor (the gateway maps every API's to it)."""


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers replaces jinja's tojson, which HTML-escapes and sorts keys.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` renders its body (transformers' AssistantTracker
    marks assistant tokens there; we only need the text)."""

    tags = {"generation"}  # noqa: RUF012 - jinja's Extension declares it as a plain class attr

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return str(caller())


@cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """Compile ``source`` once; a template that does not compile is the model's fault (500)."""
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise InternalError(f"the model's chat template does not compile: {exc}") from exc


def select_template(templates: Mapping[str, str], *, has_tools: bool) -> str:
    """Pick a named template as transformers does: ``tool_use`` when tools are given, else
    ``default``; raise 400 when the model has no chat template."""
    if has_tools and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    if len(templates) == 1:
        return next(iter(templates.values()))
    raise InvalidRequest(
        "this model has no chat template; use the completions API instead", param="messages"
    )


def content_text(content: Any) -> str:
    """A message's content as one string: ``None`` → ``""``; text parts joined with newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list | tuple):
        raise InvalidRequest(
            "message content must be a string or a list of parts", param="messages"
        )
    texts: list[str] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, Mapping) else None
        key = _TEXT_PART_KEYS.get(kind) if isinstance(kind, str) else None
        if key is None or not isinstance(part.get(key), str):
            raise InvalidRequest(
                f"unsupported content part type {kind!r}: this model takes text only",
                param="messages",
            )
        texts.append(part[key])
    return "\n".join(texts)


def template_content(content: Any) -> str | list[dict[str, Any]]:
    """``content_text``, except that a content with image parts stays a list of text and
    image parts, in order."""
    if not isinstance(content, list | tuple) or not any(
        isinstance(p, Mapping) and p.get("type") == IMAGE_PART for p in content
    ):
        return content_text(content)
    return [
        {"type": "image"}
        if isinstance(p, Mapping) and p.get("type") == IMAGE_PART
        else {"type": "text", "text": content_text([p])}
        for p in content
    ]


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages → what chat templates see (vLLM's "string" content format)."""
    result: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidRequest("every message needs a string role", param="messages")
        out: dict[str, Any] = {"role": role, "content": template_content(message.get("content"))}
        if role == "assistant":
            if message.get("tool_calls") is not None:
                out["tool_calls"] = [_tool_call(call) for call in message["tool_calls"]]
            reasoning = message.get("reasoning") or message.get("reasoning_content")
            if reasoning is not None:
                out["reasoning"] = out["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            out["name"] = message["name"]
        result.append(out)
    return result


def _tool_call(call: Any) -> dict[str, Any]:
    # Templates expect arguments as an object; OpenAI clients send a JSON string.
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise InvalidRequest("each tool call needs a function object", param="messages")
    function = dict(call["function"])
    arguments = function.get("arguments")
    if not arguments:
        function["arguments"] = {}
    elif isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except ValueError as exc:
            raise InvalidRequest(
                f"tool call arguments are not valid JSON: {exc}", param="messages"
            ) from exc
    return {**call, "function": function}


def render(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    special_tokens: Mapping[str, Any] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text for already-normalised ``messages``.

    Raises:
        InvalidRequest: the template refused the conversation (``raise_exception``), failed on
            it, or ``continue_final_message`` cannot be honoured.
    """
    if continue_final_message and add_generation_prompt:
        raise InvalidRequest(
            "continue_final_message and add_generation_prompt cannot both be true",
            param="continue_final_message",
        )
    extra = {k: v for k, v in (template_kwargs or {}).items() if k not in RESERVED_VARIABLES}
    variables = {**(special_tokens or {}), **extra}
    try:
        text = compile_template(source).render(
            messages=messages,
            tools=list(tools) if tools is not None else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.TemplateError as exc:
        raise InvalidRequest(f"chat template error: {exc}", param="messages") from exc
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        # The template ran on a conversation shape it cannot handle: the request's fault.
        raise InvalidRequest(f"chat template failed on these messages: {exc}") from exc
    return _continue_final(text, messages) if continue_final_message else text


def _continue_final(text: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """Cut the rendered chat after the final message, as transformers does."""
    final = messages[-1].get("content") if messages else None
    if not isinstance(final, str) or final.strip() not in text:
        raise InvalidRequest(
            "continue_final_message is set but the final message does not appear in the "
            "rendered chat",
            param="continue_final_message",
        )
    at = text.rindex(final.strip())
    if text[at : at + len(final.lstrip())] == final:
        return text[: at + len(final.lstrip())]
    return text[: at + len(final.strip())]
