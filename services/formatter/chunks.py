"""Response shapes as bytes: OpenAI (chat and completions, streaming and not), plain text, or
KServe gRPC messages.

Objects are msgspec Structs serialized with ``msgspec.json``; field order follows OpenAI's. The
per-token content frame is a precomputed head + the JSON-escaped text + tail, cut from a real
encoded chunk, so it is byte-identical to the Struct path at a fraction of the cost. The
``text`` format (``OutputOptions.format``, for gRPC ``ModelInfer``) is the UTF-8 text alone;
``kserve`` (for ``ModelStreamInfer``) is gRPC-framed stream responses (``shared.kserve_wire``).
"""

from __future__ import annotations

from typing import Protocol

import msgspec
from msgspec import UNSET, UnsetType

from shared import sse
from shared.kserve_wire import TextResponses, usage_parameters
from shared.messages import KServeOutput, StreamOpen

_MARK = "\x00"
_MARK_JSON = b'"\\u0000"'

_encode = msgspec.json.Encoder().encode


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    """OpenAI ``usage``, always with ``prompt_tokens_details.cached_tokens``."""
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


class Nvext(msgspec.Struct, kw_only=True):
    """Response extension asked for with ``nvext.extra_fields`` (``worker_id``: who served)."""

    worker_id: str | UnsetType = UNSET


# --- chat ---------------------------------------------------------------------------------------


class Delta(msgspec.Struct, kw_only=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    delta: Delta
    logprobs: None = None
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
    """Only on the finish chunk, and only when ``nvext.extra_fields`` asked for something."""


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    message: ChatMessage
    logprobs: None = None
    finish_reason: str


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    nvext: Nvext | UnsetType = UNSET


# --- completions --------------------------------------------------------------------------------


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class Completion(msgspec.Struct, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET
    nvext: Nvext | UnsetType = UNSET


# --- per-request shapers ------------------------------------------------------------------------


class Shaper(Protocol):
    """Bytes for one request's response; streaming methods return whole SSE frames (OpenAI) or
    bare text (``text``)."""

    def first(self, text: str, usage: Usage | None = None) -> bytes:
        """Frames for the first batch (role / echo, then ``text`` if any)."""

    def delta(self, text: str, usage: Usage | None = None) -> bytes:
        """One content frame (``usage`` only with ``continuous_usage``)."""

    def end(self, finish_reason: str, usage: Usage, nvext: Nvext | None = None) -> bytes:
        """The finish frame (with ``nvext``), the usage frame when asked for, and ``[DONE]``."""

    def body(
        self, text: str, finish_reason: str, usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        """The whole non-streaming JSON body."""


def _template(encoded: bytes) -> tuple[bytes, bytes]:
    """Split an encoded chunk whose text is ``_MARK`` into SSE head and tail."""
    head, _, tail = encoded.partition(_MARK_JSON)
    return sse.PREFIX + head, tail + sse.END


class ChatChunks:
    """``chat.completion`` / ``chat.completion.chunk`` for one request."""

    __slots__ = ("_continuous", "_head", "_id", "_include_usage", "_open", "_tail")

    def __init__(self, open_: StreamOpen) -> None:
        self._open = open_
        self._id = f"chatcmpl-{open_.request_id}"
        self._include_usage = open_.output.include_usage
        self._continuous = open_.output.include_usage and open_.output.continuous_usage
        self._head, self._tail = _template(_encode(self._chunk(Delta(content=_MARK))))

    def _chunk(
        self,
        delta: Delta,
        finish_reason: str | None = None,
        usage: Usage | None = None,
        nvext: Nvext | None = None,
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self._id,
            created=self._open.created,
            model=self._open.model,
            choices=[ChunkChoice(delta=delta, finish_reason=finish_reason)],
            usage=usage if self._include_usage else UNSET,
            nvext=UNSET if nvext is None else nvext,
        )

    def first(self, text: str, usage: Usage | None = None) -> bytes:
        role = sse.frame(_encode(self._chunk(Delta(role="assistant", content=""), usage=usage)))
        return role + self.delta(text, usage) if text else role

    def delta(self, text: str, usage: Usage | None = None) -> bytes:
        if usage is None:
            return self._head + _encode(text) + self._tail
        return sse.frame(_encode(self._chunk(Delta(content=text), usage=usage)))

    def end(self, finish_reason: str, usage: Usage, nvext: Nvext | None = None) -> bytes:
        last = usage if self._continuous else None
        out = sse.frame(_encode(self._chunk(Delta(), finish_reason, last, nvext)))
        if self._include_usage:
            final = ChatCompletionChunk(
                id=self._id,
                created=self._open.created,
                model=self._open.model,
                choices=[],
                usage=usage,
            )
            out += sse.frame(_encode(final))
        return out + sse.DONE

    def body(
        self, text: str, finish_reason: str, usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        return _encode(
            ChatCompletion(
                id=self._id,
                created=self._open.created,
                model=self._open.model,
                choices=[
                    ChatChoice(message=ChatMessage(content=text), finish_reason=finish_reason)
                ],
                usage=usage,
                nvext=UNSET if nvext is None else nvext,
            )
        )


class CompletionChunks:
    """``text_completion`` objects (streaming and not) for one request; ``echo`` prepends."""

    __slots__ = ("_continuous", "_echo", "_head", "_id", "_include_usage", "_open", "_tail")

    def __init__(self, open_: StreamOpen) -> None:
        self._open = open_
        self._id = f"cmpl-{open_.request_id}"
        self._include_usage = open_.output.include_usage
        self._continuous = open_.output.include_usage and open_.output.continuous_usage
        self._echo = open_.prompt_text if open_.output.echo else ""
        self._head, self._tail = _template(_encode(self._chunk(_MARK)))

    def _chunk(
        self,
        text: str,
        finish_reason: str | None = None,
        usage: Usage | None = None,
        nvext: Nvext | None = None,
    ) -> Completion:
        return Completion(
            id=self._id,
            created=self._open.created,
            model=self._open.model,
            choices=[CompletionChoice(text=text, finish_reason=finish_reason)],
            usage=usage if self._include_usage else UNSET,
            nvext=UNSET if nvext is None else nvext,
        )

    def first(self, text: str, usage: Usage | None = None) -> bytes:
        text = self._echo + text
        return self.delta(text, usage) if text else b""

    def delta(self, text: str, usage: Usage | None = None) -> bytes:
        if usage is None:
            return self._head + _encode(text) + self._tail
        return sse.frame(_encode(self._chunk(text, usage=usage)))

    def end(self, finish_reason: str, usage: Usage, nvext: Nvext | None = None) -> bytes:
        last = usage if self._continuous else None
        out = sse.frame(_encode(self._chunk("", finish_reason, last, nvext)))
        if self._include_usage:
            final = Completion(
                id=self._id,
                created=self._open.created,
                model=self._open.model,
                choices=[],
                usage=usage,
            )
            out += sse.frame(_encode(final))
        return out + sse.DONE

    def body(
        self, text: str, finish_reason: str, usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        body = Completion(
            id=self._id,
            created=self._open.created,
            model=self._open.model,
            choices=[CompletionChoice(text=self._echo + text, finish_reason=finish_reason)],
            usage=usage,
            nvext=UNSET if nvext is None else nvext,
        )
        return _encode(body)


class TextChunks:
    """Plain UTF-8 text for one request (``format="text"``): no framing, no JSON, no usage.

    Streaming: each delta is the new text; the finish adds nothing (the finish reason and the
    token counts travel on the done ``ResponseChunk`` itself). Not streaming: the whole text.
    ``echo`` puts the prompt text first, as for completions.
    """

    __slots__ = ("_echo",)

    def __init__(self, open_: StreamOpen) -> None:
        self._echo = open_.prompt_text if open_.output.echo else ""

    def first(self, text: str, usage: Usage | None = None) -> bytes:
        return (self._echo + text).encode()

    def delta(self, text: str, usage: Usage | None = None) -> bytes:
        return text.encode()

    def end(self, finish_reason: str, usage: Usage, nvext: Nvext | None = None) -> bytes:
        return b""

    def body(
        self, text: str, finish_reason: str, usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        return (self._echo + text).encode()


class KServeChunks:
    """gRPC-framed KServe ``ModelStreamInferResponse`` messages for one request
    (``format="kserve"``, ``shared.kserve_wire``): a ``text_output`` delta per batch with text,
    then the last response with ``finish_reason`` and the token counts as ``parameters``.
    ``body`` (not streaming) is that last response with the whole text."""

    __slots__ = ("_echo", "_responses")

    def __init__(self, open_: StreamOpen) -> None:
        kserve = open_.output.kserve or KServeOutput()
        self._responses = TextResponses(open_.model, kserve.id, kserve.outputs)
        self._echo = open_.prompt_text if open_.output.echo else ""

    def first(self, text: str, usage: Usage | None = None) -> bytes:
        text = self._echo + text
        return self._responses.delta(text.encode()) if text else b""

    def delta(self, text: str, usage: Usage | None = None) -> bytes:
        return self._responses.delta(text.encode())

    def end(self, finish_reason: str, usage: Usage, nvext: Nvext | None = None) -> bytes:
        return self._responses.last(finish_reason, _counts(usage))

    def body(
        self, text: str, finish_reason: str, usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        return self._responses.last(
            finish_reason, _counts(usage), text=(self._echo + text).encode()
        )


def _counts(usage: Usage) -> dict[str, int]:
    cached = usage.prompt_tokens_details.cached_tokens
    return usage_parameters(usage.prompt_tokens, usage.completion_tokens, cached)


def shaper_for(open_: StreamOpen) -> Shaper:
    """The shaper for the request's output format, then its API (chat or completions)."""
    if open_.output.format == "text":
        return TextChunks(open_)
    if open_.output.format == "kserve":
        return KServeChunks(open_)
    return ChatChunks(open_) if open_.api == "chat" else CompletionChunks(open_)
