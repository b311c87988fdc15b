"""Structural tags (xgrammar's ``{"type": "structural_tag", "format": …}``) for what a request's
``Guided`` forces: tool calls in the model's own syntax, JSON answers, a bounded reasoning block.

Pure: plain dicts, no xgrammar import. Both real engines use them: the vLLM worker sends the tool
call tag as ``structured_outputs.structural_tag`` (vLLM compiles it with xgrammar, decision 028);
the transformers worker compiles the whole tag itself (``services.hf_worker.grammar``).

The tool-call tags follow vLLM's own builders for ``tool_choice`` required or named
(``vllm/tool_parsers/structural_tag_registry.py``: hermes ``get_hermes_structural_tag``, and
xgrammar's built-in ``llama`` and ``qwen_3_coder`` tags that vLLM uses for ``llama3_json`` and
``qwen3_coder``): one ``tag`` per function whose ``begin`` fixes the envelope and the name, whose
``content`` is the function's ``parameters`` schema (any JSON when ``strict`` is false), joined
by ``tags_with_separator`` with ``at_least_one`` and, for a named function or
``parallel_tool_calls: false``, ``stop_after_first``. One difference from vLLM's hermes tag: the
separator between calls is ``"\\n"`` (vLLM: ``""``), which is how Qwen's chat template and
JetServe's mocker write several calls. ``mistral`` has no tag (vLLM uses a lark grammar there).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from shared.messages import Guided

__all__ = [
    "TAGGED_TOOL_SYNTAXES",
    "THINK_CLOSE",
    "THINK_OPEN",
    "NoToolTag",
    "answer_format",
    "dumps",
    "forces_tool_calls",
    "reasoning_format",
    "structural_tag",
    "tool_calls_format",
]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
REASONING_SYNTAXES = ("qwen3", "deepseek_r1")
"""Reasoning syntaxes whose block is ``<think>…</think>`` (both of ``shared.worker.parsers``)."""
_AFTER_REASONING = r"\n{0,2}"
"""Between ``</think>`` and the answer: Qwen3 writes a blank line, the mocker nothing."""


class NoToolTag(ValueError):
    """The model's tool-call syntax has no structural tag (a forced call cannot be expressed)."""

    def __init__(self, syntax: str) -> None:
        shown = repr(syntax) if syntax else "none (the model card names no tool-call parser)"
        super().__init__(
            f"tool_choice required or a named function needs a grammar in the model's tool-call "
            f"syntax; there is none for {shown} (supported: {', '.join(TAGGED_TOOL_SYNTAXES)})"
        )
        self.syntax = syntax


def forces_tool_calls(guided: Guided | None) -> bool:
    """``tool_choice`` is ``required`` or names a function (and there are tools)."""
    return guided is not None and bool(guided.tools) and guided.tool_choice not in ("auto", "none")


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = tool.get("function")
    return inner if isinstance(inner, Mapping) else tool


def _parameters(function: Mapping[str, Any]) -> dict[str, Any] | bool:
    """The schema a call's arguments must satisfy (``True``: any JSON value), as vLLM's
    ``get_function_parameters``: a function with ``strict: false`` or no parameters is free."""
    params = function.get("parameters")
    if function.get("strict") is False or not isinstance(params, Mapping):
        return True
    return dict(params)


def _tag(
    begin: str, schema: dict[str, Any] | bool, end: str, style: str = "json"
) -> dict[str, Any]:
    content: dict[str, Any] = {"type": "json_schema", "json_schema": schema}
    if style != "json":
        content["style"] = style
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def _hermes(name: str, schema: dict[str, Any] | bool) -> list[dict[str, Any]]:
    """Both envelopes vLLM's hermes tag accepts: with newlines, and compact."""
    return [
        _tag(f'<tool_call>\n{{"name": "{name}", "arguments": ', schema, "}\n</tool_call>"),
        _tag(f'<tool_call>{{"name": "{name}", "arguments": ', schema, "}</tool_call>"),
    ]


def _llama(name: str, schema: dict[str, Any] | bool) -> list[dict[str, Any]]:
    return [_tag(f'{{"name": "{name}", "parameters": ', schema, "}")]


def _qwen3_coder(name: str, schema: dict[str, Any] | bool) -> list[dict[str, Any]]:
    return [
        _tag(
            f"<tool_call>\n<function={name}>\n",
            schema,
            "\n</function>\n</tool_call>",
            style="qwen_xml",
        )
    ]


_TAGS = {"hermes": _hermes, "llama3_json": _llama, "qwen3_coder": _qwen3_coder}
_SEPARATORS = {"hermes": "\n", "llama3_json": "; ", "qwen3_coder": "\n"}
TAGGED_TOOL_SYNTAXES: tuple[str, ...] = tuple(_TAGS)
"""Tool-call syntaxes a forced call can be constrained in (``mistral`` cannot)."""


def tool_calls_format(guided: Guided) -> dict[str, Any] | None:
    """The format of the calls ``guided`` forces (``None``: ``tool_choice`` auto or none).

    Raises ``NoToolTag`` for a syntax without a tag.
    """
    if not forces_tool_calls(guided):
        return None
    make = _TAGS.get(guided.tool_syntax)
    if make is None:
        raise NoToolTag(guided.tool_syntax)
    functions = [_function(t) for t in guided.tools]
    named = guided.tool_choice != "required"
    if named:
        functions = [f for f in functions if f.get("name") == guided.tool_choice]
        if not functions:
            raise ValueError(f"tool_choice names {guided.tool_choice!r}, which is not a tool")
    tags = [tag for f in functions for tag in make(str(f.get("name", "")), _parameters(f))]
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": _SEPARATORS[guided.tool_syntax],
        "at_least_one": True,
        "stop_after_first": named or not guided.parallel_tool_calls,
    }


def answer_format(guided: Guided) -> dict[str, Any] | None:
    """What the answer (after any reasoning) must be: forced tool calls, else the
    ``response_format``'s JSON (``None``: free text). Forced calls win over a response format,
    as in vLLM's server (it drops ``response_format`` when it builds the tool tag)."""
    calls = tool_calls_format(guided)
    if calls is not None:
        return calls
    if guided.json_schema is not None:
        return {"type": "json_schema", "json_schema": guided.json_schema}
    if guided.json_object:
        return {"type": "json_schema", "json_schema": {"type": "object"}}
    return None


def reasoning_format(guided: Guided) -> dict[str, Any] | None:
    """The reasoning block before the answer, with ``max_thinking_tokens`` as its token cap
    (``None``: the model does not reason in a known syntax).

    Opened by the prompt: the output starts inside it and must close it. Asked for
    (``thinking``): the block comes first. Otherwise the model may write one or not.
    """
    if guided.reasoning_syntax not in REASONING_SYNTAXES:
        return None
    text: dict[str, Any] = {"type": "any_text"}
    if guided.max_thinking_tokens is not None:
        text["max_tokens"] = max(0, guided.max_thinking_tokens)
    begin = "" if guided.thinking_opened else THINK_OPEN
    block: dict[str, Any] = {
        "type": "sequence",
        "elements": [
            {"type": "tag", "begin": begin, "content": text, "end": THINK_CLOSE},
            {"type": "regex", "pattern": _AFTER_REASONING},
        ],
    }
    if guided.thinking_opened or guided.thinking:
        return block
    return {"type": "optional", "content": block}


def structural_tag(elements: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """A structural tag matching ``elements`` in order (``None`` ones left out; ``None`` when
    none is left)."""
    parts = [e for e in elements if e is not None]
    if not parts:
        return None
    fmt = parts[0] if len(parts) == 1 else {"type": "sequence", "elements": parts}
    return {"type": "structural_tag", "format": fmt}


def dumps(tag: dict[str, Any]) -> str:
    """A tag as the JSON text vLLM's ``structural_tag`` and xgrammar take. Keys keep their
    order: xgrammar writes an object's properties in the order its schema lists them."""
    return json.dumps(tag, ensure_ascii=False, separators=(",", ":"))
