"""OpenAI ``chat.completion`` / ``chat.completion.chunk`` bytes for one request. Pure.

Streaming: one role chunk per choice, then one chunk per piece (``delta.content``,
``delta.reasoning_content``, ``delta.tool_calls``: a call's first fragment carries ``index``,
``id``, ``type`` and ``function.name`` with empty ``arguments``, later ones ``index`` and an
``arguments`` fragment), a finish chunk per choice (``finish_reason`` ``tool_calls`` when the
model called a tool), the usage chunk and ``[DONE]``. A request that sent the deprecated
``functions`` (``OutputOptions.legacy_functions``) gets its call as ``function_call`` instead
(``delta.function_call``, ``message.function_call``, ``finish_reason: "function_call"``).
The last finish chunk is held until ``closing`` so that it carries ``nvext``. A plain content
delta with no log-probabilities and no usage takes the precomputed frame (``frames.Templates``).
The Structs are ``shared.api_objects``'.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import UNSET

from services.formatter.pieces import (
    ChoiceEnd,
    ChoiceResult,
    Collected,
    Content,
    Piece,
    Reasoning,
    TokenLogprobs,
    ToolCallStart,
)
from services.formatter.shapers.frames import OpenAIShaper, encode
from services.formatter.shaping import Nvext, Usage
from shared import sse
from shared.api_objects import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceLogprobs,
    ChunkChoice,
    ContentLogprob,
    Delta,
    Function,
    FunctionDelta,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
)
from shared.messages import StreamOpen

MIN_LOGPROB = -9999.0
"""JSON has no ``-inf``: lower log-probabilities are shown as this (as vLLM does)."""


def chat_logprobs(logprobs: Sequence[TokenLogprobs]) -> ChoiceLogprobs:
    """OpenAI chat ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    return ChoiceLogprobs(
        content=[
            ContentLogprob(
                token=t.token,
                logprob=max(t.logprob, MIN_LOGPROB),
                bytes=t.bytes,
                top_logprobs=[
                    TopLogprob(token=a.token, logprob=max(a.logprob, MIN_LOGPROB), bytes=a.bytes)
                    for a in t.top
                ],
            )
            for t in logprobs
        ]
    )


def piece_delta(piece: Piece) -> Delta:
    """The ``delta`` of one piece."""
    if isinstance(piece, Content):
        return Delta(content=piece.text)
    if isinstance(piece, Reasoning):
        return Delta(reasoning_content=piece.text)
    if isinstance(piece, ToolCallStart):
        function = FunctionDelta(name=piece.name, arguments="")
        call = ToolCallDelta(index=piece.index, id=piece.id, type="function", function=function)
        return Delta(tool_calls=[call])
    fragment = FunctionDelta(arguments=piece.text)
    return Delta(tool_calls=[ToolCallDelta(index=piece.index, function=fragment)])


def legacy_delta(delta: Delta) -> Delta:
    """A tool-call ``delta`` in the deprecated ``functions`` form (``delta.function_call``)."""
    if not delta.tool_calls:
        return delta
    return Delta(function_call=delta.tool_calls[0].function)


def chat_message(message: Collected, *, legacy_functions: bool = False) -> AssistantMessage:
    """The non-streaming ``message`` of a choice."""
    calls = [
        ToolCall(id=c.id, function=Function(name=c.name, arguments=c.arguments))
        for c in message.tool_calls
    ]
    content: str | None = message.content
    if calls and not message.content.strip():
        content = None
    if legacy_functions and calls:
        return AssistantMessage(
            content=content,
            reasoning_content=message.reasoning or UNSET,
            function_call=calls[0].function,
        )
    return AssistantMessage(
        content=content,
        reasoning_content=message.reasoning or UNSET,
        tool_calls=calls or UNSET,
    )


def finish_reason(end: ChoiceEnd, *, legacy_functions: bool) -> str:
    """OpenAI's ``finish_reason`` (``function_call`` for the deprecated ``functions``)."""
    reason = end.openai_reason
    return "function_call" if legacy_functions and reason == "tool_calls" else reason


class ChatShaper(OpenAIShaper):
    """``chat.completion`` / ``chat.completion.chunk`` for one request (``n`` choices)."""

    __slots__ = ("_legacy",)

    chunk_type = ChatCompletionChunk

    def __init__(self, open_: StreamOpen) -> None:
        self._legacy = open_.output.legacy_functions
        super().__init__(open_, "chatcmpl-")

    def _text_choice(self, index: int, text: str) -> ChunkChoice:
        return ChunkChoice(index=index, delta=Delta(content=text))

    def _finish_choice(self, index: int, end: ChoiceEnd) -> ChunkChoice:
        reason = finish_reason(end, legacy_functions=self._legacy)
        return ChunkChoice(index=index, delta=Delta(), finish_reason=reason)

    def opening(self, usage: Usage | None = None) -> bytes:
        return b"".join(
            sse.frame(encode(self._chunk([ChunkChoice(index=i, delta=_ROLE)], usage)))
            for i in range(self._n)
        )

    def delta(
        self,
        choice: int,
        pieces: Sequence[Piece],
        logprobs: Sequence[TokenLogprobs] = (),
        usage: Usage | None = None,
    ) -> bytes:
        if usage is None and not logprobs and len(pieces) == 1 and type(pieces[0]) is Content:
            return self._frames.frame(choice, pieces[0].text)  # the fast path, inlined
        deltas = [piece_delta(p) for p in pieces]
        if self._legacy:
            deltas = [legacy_delta(d) for d in deltas]
        if not deltas:
            if not logprobs:
                return b""
            deltas.append(Delta(content=""))
        shown = chat_logprobs(logprobs) if logprobs else None
        out = b""
        for delta in deltas:
            chunk = self._chunk([ChunkChoice(index=choice, delta=delta, logprobs=shown)], usage)
            out += sse.frame(encode(chunk))
            shown = None  # the batch's log-probabilities go with its first chunk
        return out

    def body(
        self, choices: Sequence[ChoiceResult], usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        items = [
            ChatChoice(
                index=c.index,
                message=chat_message(c.message, legacy_functions=self._legacy),
                logprobs=None if c.logprobs is None else chat_logprobs(c.logprobs),
                finish_reason=finish_reason(c.end, legacy_functions=self._legacy),
            )
            for c in choices
        ]
        return encode(self._envelope(ChatCompletion, items, usage, nvext))


_ROLE = Delta(role="assistant", content="")
