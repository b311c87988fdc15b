"""Reasoning parsers on real model outputs, whole and streamed (split at every character, one
character at a time, token by token through the real Qwen3 tokenizer), alone and followed by the
Hermes tool parser, as the formatter chains them.

Samples name their source. Where vLLM's tests expect otherwise we differ by design (noted): the
whitespace at the edges of the block and at the start of the answer is layout, dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from services.formatter.detokenizer import Detokenizer
from services.formatter.parsers import reasoning_parser, tool_parser
from services.formatter.pieces import (
    Content,
    Reasoning,
    TextPiece,
    ToolCallArgs,
    ToolCallStart,
    ToolPiece,
)

DATA = Path(__file__).parents[2] / "data" / "parsers"
QWQ = (DATA / "qwq32b_reasoning_then_hermes_call.txt").read_text(encoding="utf-8")
QWEN3 = (DATA / "qwen3_think_then_hermes_call.txt").read_text(encoding="utf-8")

# vLLM tests/reasoning/test_qwen3_reasoning_parser.py TOOL_CALL_BODY.
TOOL_CALL_BODY = (
    "<tool_call>\n<function=bash>\n<parameter=command>\ncat /etc/hosts\n</parameter>\n"
    "</function>\n</tool_call>"
)
R = "This is a reasoning section"

# (parser, opened, output, reasoning, content)
Case = tuple[str, bool, str, str, str]
CASES: dict[str, Case] = {
    # vLLM tests/reasoning/test_qwen3_reasoning_parser.py
    "qwen3-with-think": (
        "qwen3",
        False,
        f"<think>{R}</think>This is the rest",
        R,
        "This is the rest",
    ),
    "qwen3-complete-reasoning": ("qwen3", False, f"<think>{R}</think>", R, ""),
    "qwen3-multiline": (
        "qwen3",
        False,
        "<think>This is a reasoning\nsection</think>This is the rest\nThat",
        "This is a reasoning\nsection",
        "This is the rest\nThat",
    ),
    "qwen3-only-open-tag": ("qwen3", False, f"<think>{R}", R, ""),
    # vLLM keeps the reasoning's trailing "\n\n"; the block's edges are layout for us.
    "qwen3-tool-call-ends-reasoning": (
        "qwen3",
        False,
        "<think>I need to read the file.\n\n" + TOOL_CALL_BODY,
        "I need to read the file.",
        TOOL_CALL_BODY,
    ),
    "qwen3-thinking-disabled": (
        "qwen3",
        False,
        "This is plain content",
        "",
        "This is plain content",
    ),
    "qwen3-thinking-disabled-tool-call": (
        "qwen3",
        False,
        "I need to read the file.\n\n" + TOOL_CALL_BODY,
        "",
        "I need to read the file.\n\n" + TOOL_CALL_BODY,
    ),
    # Opened by the prompt (Qwen3 templates that end the prompt with "<think>\n").
    "qwen3-opened-without-start-token": (
        "qwen3",
        True,
        f"{R}</think>This is the rest",
        R,
        "This is the rest",
    ),
    "qwen3-opened-complete": ("qwen3", True, f"{R}</think>", R, ""),
    "qwen3-opened-truncated": ("qwen3", True, R, R, ""),
    "qwen3-opened-tool-call-no-end": (
        "qwen3",
        True,
        "I need to read the file.\n\n" + TOOL_CALL_BODY,
        "I need to read the file.",
        TOOL_CALL_BODY,
    ),
    "qwen3-opened-repeats-start-token": ("qwen3", True, f"<think>\n{R}\n</think>\n\nok", R, "ok"),
    # vLLM tests/reasoning/test_deepseekr1_reasoning_parser.py
    "r1-simple": ("deepseek_r1", False, f"{R}</think>This is the rest", R, "This is the rest"),
    "r1-complete": ("deepseek_r1", False, f"{R}</think>", R, ""),
    "r1-no-end-is-all-reasoning": ("deepseek_r1", False, "This is content", "This is content", ""),
    "r1-multiple-lines": (
        "deepseek_r1",
        False,
        "This\nThat</think>This is the rest\nThat",
        "This\nThat",
        "This is the rest\nThat",
    ),
    "r1-shortest": ("deepseek_r1", False, "</think>This is the rest", "", "This is the rest"),
    "r1-with-think": (
        "deepseek_r1",
        False,
        f"<think>{R}</think>This is the rest",
        R,
        "This is the rest",
    ),
    "r1-complete-with-think": ("deepseek_r1", False, f"<think>{R}</think>", R, ""),
    "r1-think-no-end": ("deepseek_r1", False, f"<think>{R}", R, ""),
    "r1-empty": ("deepseek_r1", False, "", "", ""),
    # vLLM expects content "\nThis is the rest"; the answer's leading whitespace is layout here.
    "r1-new-line": (
        "deepseek_r1",
        False,
        f"\n<think>{R}</think>\nThis is the rest",
        R,
        "This is the rest",
    ),
    # Real outputs: QwQ-32B (vLLM test_hermes_tool_parser.py) and Qwen3 (xorbitsai/inference
    # test_utils.py), see tests/data/parsers/README.md.
    "qwq32b-r1-style": (
        "deepseek_r1",
        False,
        QWQ,
        QWQ[: QWQ.index("</think>")].strip(),
        QWQ[QWQ.index("</think>") + len("</think>") :].lstrip(),
    ),
    "qwq32b-qwen3-opened": (
        "qwen3",
        True,
        QWQ,
        QWQ[: QWQ.index("</think>")].strip(),
        QWQ[QWQ.index("</think>") + len("</think>") :].lstrip(),
    ),
    "qwen3-xinference": (
        "qwen3",
        False,
        QWEN3,
        "好的，用户问的是上海当前的天气。我需要调用get_current_weather这个工具，"  # noqa: RUF001
        "参数是location，也就是上海。首先确认一下工具的参数是否正确，"  # noqa: RUF001
        "location是必填的，所以没问题。然后生成对应的JSON请求，"  # noqa: RUF001
        "确保参数正确无误。最后返回工具调用的XML标签。",
        '<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "上海"}}\n'
        "</tool_call>",
    ),
}
CASE_PARAMS = [pytest.param(*case, id=name) for name, case in CASES.items()]


def split(name: str, opened: bool, chunks: Sequence[str]) -> tuple[str, str]:
    parser = reasoning_parser(name, opened=opened)
    pieces: list[TextPiece] = []
    for chunk in chunks:
        pieces += parser.push(chunk)
    pieces += parser.flush()
    for piece in pieces:
        assert "<think>" not in piece.text or isinstance(piece, Content)
        assert "</think>" not in piece.text or isinstance(piece, Content)
    reasoning = "".join(p.text for p in pieces if isinstance(p, Reasoning))
    content = "".join(p.text for p in pieces if isinstance(p, Content))
    return reasoning, content


def token_texts(tokenizer: Any, text: str) -> list[str]:
    detok = Detokenizer(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pieces = [detok.push([token_id]) for token_id in ids] + [detok.flush()]
    assert "".join(pieces) == text
    return pieces


@pytest.mark.parametrize(("name", "opened", "output", "reasoning", "content"), CASE_PARAMS)
def test_whole_output(name: str, opened: bool, output: str, reasoning: str, content: str) -> None:
    assert split(name, opened, [output]) == (reasoning, content)


@pytest.mark.parametrize(("name", "opened", "output", "reasoning", "content"), CASE_PARAMS)
def test_split_at_every_character(
    name: str, opened: bool, output: str, reasoning: str, content: str
) -> None:
    for cut in range(len(output) + 1):
        got = split(name, opened, [output[:cut], output[cut:]])
        assert got == (reasoning, content), f"cut at {cut}"


@pytest.mark.parametrize(("name", "opened", "output", "reasoning", "content"), CASE_PARAMS)
def test_one_character_at_a_time(
    name: str, opened: bool, output: str, reasoning: str, content: str
) -> None:
    assert split(name, opened, list(output)) == (reasoning, content)


@pytest.mark.parametrize(("name", "opened", "output", "reasoning", "content"), CASE_PARAMS)
def test_qwen3_tokens_one_at_a_time(
    name: str, opened: bool, output: str, reasoning: str, content: str, tokenizer: Any
) -> None:
    assert split(name, opened, token_texts(tokenizer, output)) == (reasoning, content)


def test_think_tags_are_single_qwen3_tokens(tokenizer: Any) -> None:
    pieces = token_texts(tokenizer, QWEN3)
    assert "<think>" in pieces
    assert "</think>" in pieces


def test_reasoning_streams_before_the_block_closes() -> None:
    parser = reasoning_parser("qwen3")
    assert parser.push("<think>\nLet me") == [Reasoning("Let me")]
    assert parser.push(" think.\n") == [Reasoning(" think.")]  # the newline may be layout
    assert parser.push("</think>\n\nHi") == [Content("Hi")]


def test_a_possible_closing_tag_is_held_back_then_released() -> None:
    parser = reasoning_parser("deepseek_r1")
    assert parser.push("a </thi") == [Reasoning("a")]
    assert parser.push("s> b") == [Reasoning(" </this> b")]


# --- reasoning, then tool calls (the formatter's chain) -----------------------------------------


def chain(name: str, opened: bool, chunks: Sequence[str]) -> tuple[str, str, tuple[Any, ...]]:
    """Reasoning parser, then Hermes on its content; reasoning, content and calls."""
    think = reasoning_parser(name, opened=opened)
    tools = tool_parser("hermes", ids=lambda: "call_x")
    pieces: list[Reasoning | ToolPiece] = []

    def route(text_pieces: list[TextPiece]) -> None:
        for piece in text_pieces:
            if isinstance(piece, Content):
                pieces.extend(tools.push(piece.text))
            else:
                pieces.append(piece)

    for chunk in chunks:
        route(think.push(chunk))
    route(think.flush())
    pieces += tools.flush()
    names = [p.name for p in pieces if isinstance(p, ToolCallStart)]
    args = [
        "".join(p.text for p in pieces if isinstance(p, ToolCallArgs) and p.index == i)
        for i in range(len(names))
    ]
    return (
        "".join(p.text for p in pieces if isinstance(p, Reasoning)),
        "".join(p.text for p in pieces if isinstance(p, Content)),
        tuple(zip(names, [json.loads(a) for a in args], strict=True)),
    )


CHAINS = {
    "qwq32b": (
        "deepseek_r1",
        False,
        QWQ,
        (
            (
                "internet_search",
                {
                    "question": "5MW燃气轮机设计参数 空气流量 压气机压比 转速 燃烧室出口温度"
                    " 压气机级数 支点布局"
                },
            ),
        ),
    ),
    "qwen3": ("qwen3", False, QWEN3, (("get_current_weather", {"location": "上海"}),)),
}


@pytest.mark.parametrize("sample", CHAINS)
def test_reasoning_then_tool_calls(sample: str, tokenizer: Any) -> None:
    name, opened, output, calls = CHAINS[sample]
    reasoning = output[: output.index("</think>")].removeprefix("<think>").strip()
    expected = (reasoning, "", calls)
    assert chain(name, opened, [output]) == expected
    assert chain(name, opened, list(output)) == expected
    assert chain(name, opened, token_texts(tokenizer, output)) == expected
    for cut in range(len(output) + 1):
        assert chain(name, opened, [output[:cut], output[cut:]]) == expected, f"cut at {cut}"


def test_settled_once_no_reasoning_can_follow() -> None:
    """The formatter stops parsing a settled choice (its fast plain-text path)."""
    plain = reasoning_parser("qwen3")
    plain.push(" ")
    assert not plain.settled  # `<think>` may still come
    plain.push("Hello")
    assert plain.settled
    thinking = reasoning_parser("qwen3")
    thinking.push("<think>\nhm")
    assert not thinking.settled
    thinking.push("</think>\n\n")
    assert not thinking.settled  # the answer's leading whitespace is still dropped
    thinking.push("Answer")
    assert thinking.settled
