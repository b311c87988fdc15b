"""The formatter's parser registry: tool-call syntaxes and reasoning blocks, by name. Pure.

``tool_parser(name, tools=…)`` and ``reasoning_parser(name, opened=…)`` build a fresh parser for
one choice (parsers keep state). Names are those of vLLM's ``--tool-call-parser`` and
``--reasoning-parser`` where they overlap, so model cards can carry the same words.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from services.formatter.parsers import reasoning
from services.formatter.parsers._text import new_call_id
from services.formatter.parsers.hermes import HermesParser
from services.formatter.parsers.llama3_json import Llama3JsonParser
from services.formatter.parsers.mistral import MistralParser
from services.formatter.parsers.qwen3_coder import Qwen3CoderParser
from services.formatter.pieces import ReasoningParser, ToolParser

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "UnknownParser",
    "reasoning_parser",
    "tool_parser",
]

TOOL_PARSERS = ("hermes", "llama3_json", "mistral", "qwen3_coder")
REASONING_PARSERS = ("deepseek_r1", "qwen3")


class UnknownParser(ValueError):
    """A parser name that is not registered; the message lists the known ones."""

    def __init__(self, kind: str, name: str, known: Sequence[str]) -> None:
        super().__init__(f"unknown {kind} parser {name!r}; known: {', '.join(known)}")
        self.name = name
        self.known = tuple(known)


def tool_parser(
    name: str,
    *,
    tools: Sequence[Mapping[str, Any]] = (),
    ids: Callable[[], str] | None = None,
) -> ToolParser:
    """A fresh tool-call parser for syntax ``name``; ``tools`` (the request's, OpenAI shape)
    type the values of syntaxes that write them as text; ``ids`` makes call ids (tests)."""
    make_id = ids or new_call_id
    if name == "hermes":
        return HermesParser(ids=make_id)
    if name == "llama3_json":
        return Llama3JsonParser(ids=make_id)
    if name == "mistral":
        return MistralParser(ids=make_id)
    if name == "qwen3_coder":
        return Qwen3CoderParser(tools=tools, ids=make_id)
    raise UnknownParser("tool", name, TOOL_PARSERS)


def reasoning_parser(name: str, *, opened: bool = False) -> ReasoningParser:
    """A fresh reasoning parser; ``opened``: the rendered prompt ends inside a ``<think>``."""
    if name == "qwen3":
        return reasoning.qwen3(opened=opened)
    if name == "deepseek_r1":
        return reasoning.deepseek_r1(opened=opened)
    raise UnknownParser("reasoning", name, REASONING_PARSERS)
