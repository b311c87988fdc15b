"""Complete a request's ``Guided`` and output options from the model's card (pure, decision 019).

The gateway knows what the client asked (tools, ``tool_choice``, ``response_format``); only the
preprocessor knows the model: its tool-call and reasoning syntax (``ModelCard.tool_parser`` /
``reasoning_parser``, carried on ``ModelAssets``) and the rendered prompt. From them it sets what
the engine must write (``Guided.tool_syntax``, ``reasoning_syntax``, ``thinking``,
``thinking_opened``, ``tool_turn``) and what the formatter must parse (``OutputOptions``
``tool_parser``, ``reasoning_parser``, ``reasoning_open``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from services.preprocessor.tokenizer import ModelAssets
from shared.messages import Guided, OutputOptions, Preprocess

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def resolve(
    req: Preprocess, assets: ModelAssets, prompt_text: str | None
) -> tuple[Guided | None, OutputOptions]:
    """``(guided, output)`` for this request. ``prompt_text``: the rendered chat prompt (or the
    completion prompt), ``None`` when only token ids were given.

    ``guided`` stays ``None`` when there is nothing to guide (no tools, no response format, no
    reasoning), so a plain request's ``SamplingParams`` are unchanged. Only chat requests think:
    a completion's prompt is the client's own text, and completions have no reasoning field.
    The reasoning parser is set whenever thinking is not off (``enable_thinking: false``): with
    it off, a parser such as ``deepseek_r1`` (reasoning until ``</think>`` even without
    ``<think>``) would take the whole answer for reasoning. The mocker writes a reasoning block
    only when thinking was asked for (``thinking_requested``).
    """
    guided = req.sampling.guided
    tools = guided.tools if guided is not None and guided.tools else tuple(req.tools or ())
    is_chat = req.api == "chat"
    may_think = (
        is_chat and bool(assets.reasoning_parser) and thinking_enabled(req.chat_template_kwargs)
    )
    thinking = may_think and thinking_requested(req.chat_template_kwargs)
    opened = may_think and opens_reasoning(prompt_text or "")
    if guided is None and not thinking and not tools and not may_think:
        return None, req.output
    if guided is None and not thinking and not tools:  # parse what a real model may write
        return None, msgspec.structs.replace(
            req.output, reasoning_parser=assets.reasoning_parser, reasoning_open=opened
        )
    base = guided if guided is not None else Guided()
    guided = msgspec.structs.replace(
        base,
        tools=tools,
        tool_syntax=assets.tool_parser,
        # empty when thinking is off: engines then allow no reasoning block (decision 028)
        reasoning_syntax=assets.reasoning_parser if may_think else "",
        thinking=thinking,
        thinking_opened=opened,
        tool_turn=tool_turn(req.messages) if is_chat else True,
    )
    calls_possible = bool(tools) and guided.tool_choice != "none"
    output = msgspec.structs.replace(
        req.output,
        tool_parser=assets.tool_parser if calls_possible else "",
        reasoning_parser=assets.reasoning_parser if may_think else "",
        reasoning_open=opened,
    )
    return guided, output


def thinking_requested(template_kwargs: Mapping[str, Any]) -> bool:
    """The client turned thinking on explicitly (``enable_thinking`` / ``thinking`` true): the
    mocker writes a reasoning block only then (decision 019). A real Qwen3 thinks unless told
    not to; the formatter's reasoning parser is set whenever thinking is not off, so a real
    engine's reasoning is parsed either way, and a plain request to the mocker stays a plain
    answer (tests and benchmarks compare like with like)."""
    return any(template_kwargs.get(key) is True for key in ("enable_thinking", "thinking"))


def thinking_enabled(template_kwargs: Mapping[str, Any]) -> bool:
    """Thinking is on unless the client turned it off (``enable_thinking`` or ``thinking``
    false in ``chat_template_kwargs``, as Qwen3 and DeepSeek templates read them)."""
    return all(template_kwargs.get(key) is not False for key in ("enable_thinking", "thinking"))


def opens_reasoning(prompt: str) -> bool:
    """The prompt ends inside a ``<think>`` block (a template that opens it, as DeepSeek-R1's)."""
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


def tool_turn(messages: Sequence[Mapping[str, Any]]) -> bool:
    """The model answers the user (not a tool result): a simulated model calls tools only then
    under ``tool_choice="auto"``."""
    return not messages or messages[-1].get("role") != "tool"
