"""gRPC output for one request: bare UTF-8 text (``format="text"``, ``ModelInfer``) or
gRPC-framed KServe stream responses (``format="kserve"``, ``ModelStreamInfer``). Pure.

Neither has a place for reasoning or tool calls: the text is every content and reasoning piece
in order (the formatter runs no parser for these formats). ``echo`` puts the prompt text first.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.formatter.pieces import ChoiceEnd, ChoiceResult, Piece, TokenLogprobs
from services.formatter.shapers.frames import text_of
from services.formatter.shaping import Nvext, Usage
from shared.kserve_wire import TextResponses, usage_parameters
from shared.messages import KServeOutput, StreamOpen


class _TextOut:
    """What both gRPC shapers do: every delta is the new text (the echo first), framed by
    ``_emit``; no opening."""

    __slots__ = ("_echo",)

    def __init__(self, open_: StreamOpen) -> None:
        self._echo = open_.prompt_text if open_.output.echo else ""

    def _emit(self, text: str) -> bytes:
        """The bytes of a delta's text (``b""`` or a frame for empty text)."""
        raise NotImplementedError

    def _text(self, pieces: Sequence[Piece]) -> bytes:
        text, self._echo = self._echo + text_of(pieces), ""
        return self._emit(text)

    def opening(self, usage: Usage | None = None) -> bytes:
        return b""

    def delta(
        self,
        choice: int,
        pieces: Sequence[Piece],
        logprobs: Sequence[TokenLogprobs] = (),
        usage: Usage | None = None,
    ) -> bytes:
        return self._text(pieces)

    def text_delta(self, choice: int, text: str) -> bytes:
        if self._echo:
            text, self._echo = self._echo + text, ""
        return self._emit(text)

    def choice_end(self, choice: int, end: ChoiceEnd, usage: Usage | None = None) -> bytes:
        return self._text(())


class TextShaper(_TextOut):
    """Plain UTF-8 text (``format="text"``): no framing, no JSON, no usage.

    Streaming: each delta is the new text; the finish adds nothing (the finish reason and the
    token counts travel on the done ``ResponseChunk`` itself). Not streaming: the whole text.
    """

    __slots__ = ()

    def _emit(self, text: str) -> bytes:
        return text.encode()

    def closing(self, usage: Usage, nvext: Nvext | None = None) -> bytes:
        return b""

    def body(
        self, choices: Sequence[ChoiceResult], usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        message = choices[0].message
        return (self._echo + message.reasoning + message.content).encode()


class KServeShaper(_TextOut):
    """KServe ``ModelStreamInferResponse`` messages (``shared.kserve_wire``): a ``text_output``
    delta per batch with text, then the last response with ``finish_reason`` and the token counts
    as ``parameters``. ``body`` (not streaming) is that last response with the whole text."""

    __slots__ = ("_finish_reason", "_responses")

    def __init__(self, open_: StreamOpen) -> None:
        super().__init__(open_)
        kserve = open_.output.kserve or KServeOutput()
        self._responses = TextResponses(open_.model, kserve.id, kserve.outputs)
        self._finish_reason: str | None = None

    def _emit(self, text: str) -> bytes:
        return self._responses.delta(text.encode()) if text else b""

    def choice_end(self, choice: int, end: ChoiceEnd, usage: Usage | None = None) -> bytes:
        if self._finish_reason is None or choice == 0:
            self._finish_reason = end.finish_reason
        return super().choice_end(choice, end, usage)

    def closing(self, usage: Usage, nvext: Nvext | None = None) -> bytes:
        return self._responses.last(self._finish_reason or "stop", _counts(usage))

    def body(
        self, choices: Sequence[ChoiceResult], usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        first = choices[0]
        text = self._echo + first.message.reasoning + first.message.content
        return self._responses.last(first.end.finish_reason, _counts(usage), text=text.encode())


def _counts(usage: Usage) -> dict[str, int]:
    cached = usage.prompt_tokens_details.cached_tokens
    return usage_parameters(usage.prompt_tokens, usage.completion_tokens, cached)
