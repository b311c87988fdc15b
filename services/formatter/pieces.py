"""What the formatter makes of a model's text before shaping it: pieces, and the parser protocols.

Pure. Detokenized text goes through the request's reasoning parser (``<think>`` blocks become
``Reasoning``), then its tool parser (the model's tool-call syntax becomes ``ToolCallStart`` +
``ToolCallArgs``); what is left is ``Content``. Shapers (one per output format: OpenAI chat and
completions, Anthropic Messages, the Responses API) turn pieces into the protocol's frames.

Streaming contract of every parser: ``push`` returns the pieces that are certain so far (text
that might still turn out to be the start of a marker is held back); ``flush`` at the end
returns what is left (an unfinished tool call is given back as content, as vLLM does). The
``ToolCallArgs`` fragments of one call concatenate to its arguments as a JSON object text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar


@dataclass(frozen=True, slots=True)
class Content:
    """Answer text."""

    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Text inside the model's reasoning block (``reasoning_content``; Anthropic ``thinking``)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins: ``index`` counts the calls of one choice from 0."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgs:
    """A fragment of the arguments (JSON text) of call ``index``."""

    index: int
    text: str


Piece = Content | Reasoning | ToolCallStart | ToolCallArgs
TextPiece = Content | Reasoning
ToolPiece = Content | ToolCallStart | ToolCallArgs


class ReasoningParser(Protocol):
    """Splits reasoning from the answer (``<think>…</think>``). ``settled``: from now on every
    text is content, unchanged (the caller may stop parsing)."""

    @property
    def settled(self) -> bool: ...

    def push(self, text: str) -> list[TextPiece]: ...

    def flush(self) -> list[TextPiece]: ...


class ToolParser(Protocol):
    """Finds tool calls in answer text (one parser per model syntax)."""

    def push(self, text: str) -> list[ToolPiece]: ...

    def flush(self) -> list[ToolPiece]: ...


@dataclass(slots=True)
class ToolCall:
    """A whole tool call (non-streaming responses)."""

    id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class Collected:
    """Pieces gathered into one message: what a non-streaming response shows."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def add(self, pieces: Sequence[Piece]) -> None:
        for piece in pieces:
            if isinstance(piece, Content):
                self.content += piece.text
            elif isinstance(piece, Reasoning):
                self.reasoning += piece.text
            elif isinstance(piece, ToolCallStart):
                self.tool_calls.append(ToolCall(id=piece.id, name=piece.name))
            else:
                self.tool_calls[piece.index].arguments += piece.text


# --- what shapers get ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One alternative token: its text, log-probability and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One generated token with its log-probability and ``top`` alternatives (most likely
    first), as text: what OpenAI's ``logprobs`` objects show."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ChoiceEnd:
    """How one choice ended: the engine's ``finish_reason`` (``stop``, ``length``…), whether it
    made tool calls (OpenAI ``tool_calls``, Anthropic ``tool_use``), and the stop string that
    ended it, if one did (Anthropic ``stop_sequence``)."""

    finish_reason: str
    has_tool_calls: bool = False
    stop_string: str | None = None

    @property
    def openai_reason(self) -> str:
        """OpenAI's ``finish_reason``: ``tool_calls`` when the model called a tool."""
        if self.has_tool_calls and self.finish_reason == "stop":
            return "tool_calls"
        return self.finish_reason


@dataclass(slots=True)
class ChoiceResult:
    """One whole choice, for a non-streaming body."""

    index: int
    message: Collected
    end: ChoiceEnd
    logprobs: list[TokenLogprobs] | None = None
    """``None`` unless the request asked for log-probabilities."""


P = TypeVar("P", bound=Piece)


def tidy(pieces: Sequence[P]) -> list[P]:
    """Drop empty text; join neighbours of one kind (content, reasoning, one call's arguments)."""
    out: list[P] = []
    for piece in pieces:
        if isinstance(piece, ToolCallStart):
            out.append(piece)
            continue
        if not piece.text:
            continue
        last = out[-1] if out else None
        if type(last) is type(piece):
            if isinstance(piece, ToolCallArgs):
                assert isinstance(last, ToolCallArgs)
                if last.index == piece.index:
                    out[-1] = ToolCallArgs(piece.index, last.text + piece.text)  # type: ignore[assignment]
                    continue
            elif isinstance(last, Content | Reasoning):
                out[-1] = type(piece)(last.text + piece.text)
                continue
        out.append(piece)
    return out


def collect(pieces: Sequence[Piece]) -> Collected:
    """A choice's pieces as one message (joined once: no quadratic string building)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    arguments: list[list[str]] = []
    for piece in pieces:
        if isinstance(piece, Content):
            content.append(piece.text)
        elif isinstance(piece, Reasoning):
            reasoning.append(piece.text)
        elif isinstance(piece, ToolCallStart):
            calls.append(ToolCall(id=piece.id, name=piece.name))
            arguments.append([])
        elif 0 <= piece.index < len(arguments):
            arguments[piece.index].append(piece.text)
    for call, parts in zip(calls, arguments, strict=True):
        call.arguments = "".join(parts)
    return Collected("".join(content), "".join(reasoning), calls)
