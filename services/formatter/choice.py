"""One choice of a request: its detokenizer, its reasoning and tool parsers, and what it has
produced so far; ``choices_for`` makes a request's ``n``. Pure.

The parsers (``services.formatter.parsers``) are imported when a request first needs one.
"""

from __future__ import annotations

from typing import Any

from services.formatter.detokenizer import Detokenizer
from services.formatter.pieces import (
    ChoiceEnd,
    Content,
    Piece,
    ReasoningParser,
    TextPiece,
    TokenLogprobs,
    ToolCallStart,
    ToolParser,
    tidy,
)
from shared.errors import InternalError
from shared.messages import OutputOptions, StreamOpen

PARSED_FORMATS = frozenset({"openai", "anthropic", "responses"})
"""Formats with a place for reasoning and tool calls (chat only); gRPC text gets the raw text."""


class Choice:
    """One choice's state: its detokenizer and parsers, and what it has produced so far."""

    __slots__ = (
        "detok",
        "end",
        "has_tool_calls",
        "logprobs",
        "next_index",
        "pieces",
        "plain",
        "reasoning",
        "tools",
    )

    def __init__(
        self,
        detok: Detokenizer,
        reasoning: ReasoningParser | None,
        tools: ToolParser | None,
        *,
        keep_logprobs: bool,
    ) -> None:
        self.detok = detok
        self.reasoning = reasoning
        self.tools = tools
        self.plain = reasoning is None and tools is None
        """No parser: every text is content."""
        self.next_index = 0
        """The position the next batch of this choice should start at."""
        self.end: ChoiceEnd | None = None
        self.has_tool_calls = False
        self.pieces: list[Piece] = []
        """Not streaming: every piece so far."""
        self.logprobs: list[TokenLogprobs] | None = [] if keep_logprobs else None
        """Not streaming, with log-probabilities asked for: every token's so far."""

    def parse(self, text: str, final: bool) -> list[Piece]:
        """The pieces of the new ``text`` (``final``: the choice ends, flush the parsers)."""
        reasoning, tools = self.reasoning, self.tools
        texts: list[TextPiece]
        if reasoning is None:
            texts = [Content(text)] if text else []
        else:
            texts = reasoning.push(text) if text else []
            if final:
                texts += reasoning.flush()
            elif reasoning.settled:  # no (more) reasoning: plain text from here on
                self.reasoning = None
                self.plain = tools is None
        if tools is None:
            return tidy(texts)
        pieces: list[Piece] = []
        for piece in texts:
            if isinstance(piece, Content):
                if piece.text:
                    pieces += tools.push(piece.text)
            else:
                pieces.append(piece)
        if final:
            pieces += tools.flush()
        pieces = tidy(pieces)
        if not self.has_tool_calls:
            self.has_tool_calls = any(isinstance(p, ToolCallStart) for p in pieces)
        return pieces


def choices_for(open_: StreamOpen, tokenizer: Any, *, keep_logprobs: bool) -> list[Choice]:
    """The request's ``n`` choices, each with its own detokenizer and parsers (chat requests in
    a format with a place for reasoning and tools)."""
    out = open_.output
    parsed = open_.api == "chat" and out.format in PARSED_FORMATS
    return [
        Choice(
            Detokenizer(
                tokenizer,
                stop=out.stop,
                include_stop_str_in_output=out.include_stop_str_in_output,
                skip_special_tokens=out.skip_special_tokens,
            ),
            reasoning_parser_for(out) if parsed else None,
            tool_parser_for(open_) if parsed else None,
            keep_logprobs=keep_logprobs,
        )
        for _ in range(max(1, out.n))
    ]


def reasoning_parser_for(out: OutputOptions) -> ReasoningParser | None:
    """A new reasoning parser for one choice (``None``: reasoning stays content)."""
    if not out.reasoning_parser:
        return None
    from services.formatter.parsers import (  # type: ignore[attr-defined,import-not-found,unused-ignore]
        reasoning_parser,
    )

    try:
        parser: ReasoningParser = reasoning_parser(out.reasoning_parser, opened=out.reasoning_open)
    except (KeyError, ValueError) as exc:
        raise InternalError(f"unknown reasoning parser {out.reasoning_parser!r}") from exc
    return parser


def tool_parser_for(open_: StreamOpen) -> ToolParser | None:
    """A new tool parser for one choice (``None``: no tool calls are parsed); with
    ``parallel_tool_calls`` false it answers only the first call."""
    name = open_.output.tool_parser
    if not name:
        return None
    from services.formatter.parsers import (  # type: ignore[attr-defined,import-not-found,unused-ignore]
        tool_parser,
    )

    try:
        parser: ToolParser = tool_parser(name, tools=open_.tools)
    except (KeyError, ValueError) as exc:
        raise InternalError(f"unknown tool parser {name!r}") from exc
    if not open_.output.parallel_tool_calls:
        from services.formatter.parsers.first_call import FirstCallOnly

        return FirstCallOnly(parser)
    return parser
