"""What a real model would write under ``Guided`` (pure): a reasoning block, tool calls in the
model's own syntax, or a JSON document, as text and then as token ids (decision 019).

The mocker samples nothing, so it writes output that already satisfies the request: the
formatter's reasoning and tool parsers then see what they would see from a real model. Every
choice is a function of a seed (the request's seed or prompt hash, and the choice), so a
request repeated gives the same output.

Syntaxes (named as the formatter's parsers):

- ``hermes``: ``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``, calls joined by
  ``\\n``.
- ``llama3_json``: ``{"name": …, "parameters": {…}}``, calls joined by ``; ``.
- ``mistral``: ``[TOOL_CALLS][{"name": …, "arguments": {…}}, …]``.
- ``qwen3_coder``: ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n…
  </function>\\n</tool_call>`` (string values raw, others as JSON).
- Reasoning (``qwen3``, ``deepseek_r1``): ``<think>\\n…\\n</think>\\n\\n`` before the answer;
  without the opening tag when the prompt already opened it.

An unknown or empty ``tool_syntax`` is written as ``hermes``, the most common one.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from services.mocker.corpus import CORPUS
from services.mocker.schema_instance import instance
from shared.messages import Guided

THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
SYNTAXES = ("hermes", "llama3_json", "mistral", "qwen3_coder")

Encode = Callable[[str], Sequence[int]]
"""The worker's tokenizer: text → ids, no special tokens added."""


@dataclass(frozen=True, slots=True)
class Written:
    """The output text of one choice, in parts."""

    reasoning: str | None = None
    """The reasoning prose (inside the block), when the model thinks."""
    opened: bool = False
    """The prompt opened the reasoning block: no ``<think>`` is written."""
    answer: str | None = None
    """Tool calls or a JSON document; ``None``: the answer is free prose (the corpus)."""

    def text(self) -> str:
        """The whole structured text (reasoning block, then the answer if it is structured)."""
        head = ""
        if self.reasoning is not None:
            head = ("" if self.opened else THINK_OPEN) + self.reasoning + THINK_CLOSE
        return head + (self.answer or "")


@dataclass(frozen=True, slots=True)
class Script:
    """Token ids the engine emits before anything else."""

    ids: tuple[int, ...]
    ends: bool
    """True: EOS follows the ids (a structured answer is complete). False: corpus prose follows
    (a free answer after a reasoning block)."""


def write(guided: Guided, seed: int | str) -> Written:
    """The text a model would produce for ``guided`` (deterministic in ``seed``)."""
    rng = random.Random(f"guided:{seed}")
    reasoning = _prose(rng, rng.randint(1, 2)) if guided.thinking else None
    answer: str | None = None
    if calls_tools(guided):
        answer = format_calls(guided.tool_syntax, _pick_calls(guided, rng))
    elif guided.json_schema is not None:
        answer = json.dumps(
            instance(guided.json_schema, rng.randrange(1 << 30)), ensure_ascii=False
        )
    elif guided.json_object:
        answer = json.dumps({"answer": _prose(rng, 1)}, ensure_ascii=False)
    return Written(reasoning=reasoning, opened=guided.thinking_opened, answer=answer)


def script(guided: Guided, seed: int | str, encode: Encode) -> Script | None:
    """``write``'s text as token ids (``None``: nothing structured, the corpus as usual).

    ``max_thinking_tokens`` cuts the reasoning prose (not its tags) to that many tokens.
    """
    written = write(guided, seed)
    if written.reasoning is None and written.answer is None:
        return None
    ids: list[int] = []
    if written.reasoning is not None:
        if not written.opened:
            ids += encode(THINK_OPEN)
        prose = list(encode(written.reasoning))
        if guided.max_thinking_tokens is not None:
            prose = prose[: max(0, guided.max_thinking_tokens)]
        ids += prose
        ids += encode(THINK_CLOSE)
    if written.answer is not None:
        ids += encode(written.answer)
    return Script(ids=tuple(ids), ends=written.answer is not None)


def calls_tools(guided: Guided) -> bool:
    """Whether the model calls tools: ``required`` or a named function always, ``auto`` when
    the conversation ends with the user (``tool_turn``), ``none`` never."""
    if not guided.tools or guided.tool_choice == "none":
        return False
    return guided.tool_choice != "auto" or guided.tool_turn


def format_calls(syntax: str, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Tool calls ``(name, arguments)`` in ``syntax``."""
    if syntax == "llama3_json":
        return "; ".join(_dumps({"name": name, "parameters": args}) for name, args in calls)
    if syntax == "mistral":
        return "[TOOL_CALLS]" + _dumps([{"name": n, "arguments": a} for n, a in calls])
    if syntax == "qwen3_coder":
        return "\n".join(_coder_call(name, args) for name, args in calls)
    return "\n".join(
        f"<tool_call>\n{_dumps({'name': name, 'arguments': args})}\n</tool_call>"
        for name, args in calls
    )


def tool_function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """A function definition, from ``{"name", …}`` or OpenAI's ``{"type", "function": {…}}``."""
    inner = tool.get("function")
    return inner if isinstance(inner, Mapping) else tool


def _pick_calls(guided: Guided, rng: random.Random) -> list[tuple[str, Mapping[str, Any]]]:
    functions = [tool_function(t) for t in guided.tools]
    functions = [f for f in functions if isinstance(f.get("name"), str)]
    if guided.tool_choice not in ("auto", "required"):
        chosen = [f for f in functions if f["name"] == guided.tool_choice][:1]
        if not chosen:
            chosen = [{"name": guided.tool_choice}]
    elif guided.parallel_tool_calls and len(functions) >= 2:
        chosen = rng.sample(functions, 2)
    else:
        chosen = [functions[rng.randrange(len(functions))]] if functions else []
    calls: list[tuple[str, Mapping[str, Any]]] = []
    for function in chosen:
        params = function.get("parameters")
        args = instance(params, rng.randrange(1 << 30)) if isinstance(params, Mapping) else {}
        calls.append((str(function["name"]), args if isinstance(args, Mapping) else {}))
    return calls


def _coder_call(name: str, args: Mapping[str, Any]) -> str:
    params = "".join(
        f"<parameter={key}>\n{value if isinstance(value, str) else _dumps(value)}\n</parameter>\n"
        for key, value in args.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@cache
def _sentences() -> tuple[str, ...]:
    text = " ".join(CORPUS.split())
    return tuple(s for s in re.split(r"(?<=[.!?])\s+", text) if s)


def _prose(rng: random.Random, count: int) -> str:
    sentences = _sentences()
    start = rng.randrange(len(sentences))
    return " ".join(sentences[(start + i) % len(sentences)] for i in range(count))
