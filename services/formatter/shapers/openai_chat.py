"""OpenAI ``chat.completion`` / ``chat.completion.chunk`` bytes for one request. Pure.

Streaming: one role chunk per choice, then one chunk per piece (``delta.content``,
``delta.reasoning_content``, ``delta.tool_calls``: a call's first fragment carries ``index``,
``id``, ``type`` and ``function.name`` with empty ``arguments``, later ones ``index`` and an
``arguments`` fragment), a finish chunk per choice (``finish_reason`` ``tool_calls`` when the
model called a tool), the usage chunk and ``[DONE]``. The last finish chunk is held until
``closing`` so that it carries ``nvext``. A plain content delta with no log-probabilities and no
usage takes the precomputed frame (``frames.Templates``). Field order follows OpenAI's.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from msgspec import UNSET, UnsetType

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
from services.formatter.shapers.frames import MARK, Templates, encode
from services.formatter.shaping import Nvext, Usage
from shared import sse
from shared.messages import StreamOpen

MIN_LOGPROB = -9999.0
"""JSON has no ``-inf``: lower log-probabilities are shown as this (as vLLM does)."""


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: tuple[int, ...] | None


class ContentLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: tuple[int, ...] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct, kw_only=True):
    content: list[ContentLogprob] | None


class FunctionDelta(msgspec.Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str


class ToolCallDelta(msgspec.Struct, kw_only=True):
    index: int
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: FunctionDelta


class Delta(msgspec.Struct, kw_only=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | UnsetType | None = UNSET
    """Absent unless ``include_usage``; then ``null`` on every chunk but the last."""
    nvext: Nvext | UnsetType = UNSET
    """Only on the last finish chunk, and only when ``nvext.extra_fields`` asked for something."""


class Function(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function"
    function: Function


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str | None
    """``null`` when the message is only tool calls (as OpenAI)."""
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCall] | UnsetType = UNSET


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    message: ChatMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    nvext: Nvext | UnsetType = UNSET


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


def chat_message(message: Collected) -> ChatMessage:
    """The non-streaming ``message`` of a choice."""
    calls = [
        ToolCall(id=c.id, function=Function(name=c.name, arguments=c.arguments))
        for c in message.tool_calls
    ]
    content: str | None = message.content
    if calls and not message.content.strip():
        content = None
    return ChatMessage(
        content=content,
        reasoning_content=message.reasoning or UNSET,
        tool_calls=calls or UNSET,
    )


class ChatShaper:
    """``chat.completion`` / ``chat.completion.chunk`` for one request (``n`` choices)."""

    __slots__ = (
        "_continuous",
        "_ended",
        "_frames",
        "_id",
        "_include_usage",
        "_last",
        "_n",
        "_open",
    )

    def __init__(self, open_: StreamOpen) -> None:
        self._open = open_
        self._id = f"chatcmpl-{open_.request_id}"
        self._include_usage = open_.output.include_usage
        self._continuous = open_.output.include_usage and open_.output.continuous_usage
        self._n = max(1, open_.output.n)
        self._ended = 0
        self._last: tuple[int, ChoiceEnd, Usage | None] | None = None
        """The last choice's finish, held for ``closing``."""
        self._frames = Templates(
            lambda index: self._chunk([ChunkChoice(index=index, delta=Delta(content=MARK))])
        )

    def _chunk(
        self, choices: list[ChunkChoice], usage: Usage | None = None, nvext: Nvext | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self._id,
            created=self._open.created,
            model=self._open.model,
            choices=choices,
            usage=usage if self._include_usage else UNSET,
            nvext=UNSET if nvext is None else nvext,
        )

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

    def text_delta(self, choice: int, text: str) -> bytes:
        return self._frames.frame(choice, text)

    def choice_end(self, choice: int, end: ChoiceEnd, usage: Usage | None = None) -> bytes:
        self._ended += 1
        if self._ended >= self._n:
            self._last = (choice, end, usage)
            return b""
        return self._finish(choice, end, usage)

    def _finish(
        self, choice: int, end: ChoiceEnd, usage: Usage | None, nvext: Nvext | None = None
    ) -> bytes:
        finish = ChunkChoice(index=choice, delta=Delta(), finish_reason=end.openai_reason)
        return sse.frame(encode(self._chunk([finish], usage, nvext)))

    def closing(self, usage: Usage, nvext: Nvext | None = None) -> bytes:
        out = b"" if self._last is None else self._finish(*self._last, nvext)
        if self._include_usage:
            final = ChatCompletionChunk(
                id=self._id,
                created=self._open.created,
                model=self._open.model,
                choices=[],
                usage=usage,
            )
            out += sse.frame(encode(final))
        return out + sse.DONE

    def body(
        self, choices: Sequence[ChoiceResult], usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        return encode(
            ChatCompletion(
                id=self._id,
                created=self._open.created,
                model=self._open.model,
                choices=[
                    ChatChoice(
                        index=c.index,
                        message=chat_message(c.message),
                        logprobs=None if c.logprobs is None else chat_logprobs(c.logprobs),
                        finish_reason=c.end.openai_reason,
                    )
                    for c in choices
                ],
                usage=usage,
                nvext=UNSET if nvext is None else nvext,
            )
        )


_ROLE = Delta(role="assistant", content="")
