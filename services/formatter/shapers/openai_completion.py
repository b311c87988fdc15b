"""OpenAI ``text_completion`` bytes for one request (streaming and not). Pure.

``n`` choices, each with its ``index``; ``echo`` puts the prompt text before each choice's text
(streaming: with its first delta, or alone when it ends without text). ``logprobs`` come in the
legacy form: ``tokens``, ``token_logprobs``, ``top_logprobs`` (one ``{token: logprob}`` per
token, the sampled token included, so up to ``logprobs + 1`` entries as OpenAI documents) and
``text_offset`` (each token's character offset in the choice's text, echo included). The last
finish chunk is held until ``closing`` so that it carries ``nvext``.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.formatter.pieces import ChoiceEnd, ChoiceResult, Content, Piece, TokenLogprobs
from services.formatter.shapers.frames import OpenAIShaper, encode, plain_text, text_of
from services.formatter.shapers.openai_chat import MIN_LOGPROB
from services.formatter.shaping import Nvext, Usage
from shared import sse
from shared.api_objects import Completion, CompletionChoice, CompletionLogprobs
from shared.messages import StreamOpen


def legacy_logprobs(logprobs: Sequence[TokenLogprobs], offset: int) -> CompletionLogprobs:
    """The legacy ``logprobs`` object of tokens whose text starts at character ``offset``."""
    shown = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for t in logprobs:
        logprob = max(t.logprob, MIN_LOGPROB)
        top = {a.token: max(a.logprob, MIN_LOGPROB) for a in t.top}
        top.setdefault(t.token, logprob)
        shown.tokens.append(t.token)
        shown.token_logprobs.append(logprob)
        shown.top_logprobs.append(top)
        shown.text_offset.append(offset)
        offset += len(t.token)
    return shown


class CompletionShaper(OpenAIShaper):
    """``text_completion`` objects for one request; ``echo`` prepends the prompt."""

    __slots__ = ("_echo", "_echo_due", "_offsets")

    chunk_type = Completion

    def __init__(self, open_: StreamOpen) -> None:
        super().__init__(open_, "cmpl-")
        self._echo = open_.prompt_text if open_.output.echo else ""
        self._echo_due = set(range(self._n)) if self._echo else set()
        """Choices whose echo is not sent yet."""
        self._offsets = [len(self._echo)] * self._n
        """Per choice: the character offset of its next token (``text_offset``)."""

    def _text_choice(self, index: int, text: str) -> CompletionChoice:
        return CompletionChoice(index=index, text=text)

    def _finish_choice(self, index: int, end: ChoiceEnd) -> CompletionChoice:
        return CompletionChoice(index=index, text="", finish_reason=end.finish_reason)

    def opening(self, usage: Usage | None = None) -> bytes:
        return b""

    def delta(
        self,
        choice: int,
        pieces: Sequence[Piece],
        logprobs: Sequence[TokenLogprobs] = (),
        usage: Usage | None = None,
    ) -> bytes:
        text = plain_text(pieces, logprobs, usage)
        if text is not None and choice not in self._echo_due:
            return self._frames.frame(choice, text)
        text = text_of(pieces) if text is None else text
        if choice in self._echo_due:
            self._echo_due.discard(choice)
            text = self._echo + text
        if not text and not logprobs:
            return b""
        if usage is None and not logprobs:
            return self._frames.frame(choice, text)
        shown = None
        if logprobs and 0 <= choice < self._n:
            shown = legacy_logprobs(logprobs, self._offsets[choice])
            self._offsets[choice] += sum(len(t.token) for t in logprobs)
        item = CompletionChoice(index=choice, text=text, logprobs=shown)
        return sse.frame(encode(self._chunk([item], usage)))

    def text_delta(self, choice: int, text: str) -> bytes:
        if choice in self._echo_due:
            return self.delta(choice, [Content(text)])
        return self._frames.frame(choice, text)

    def choice_end(self, choice: int, end: ChoiceEnd, usage: Usage | None = None) -> bytes:
        out = self.delta(choice, (), (), usage) if choice in self._echo_due else b""
        return out + super().choice_end(choice, end, usage)

    def body(
        self, choices: Sequence[ChoiceResult], usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        echo = self._echo
        items = [
            CompletionChoice(
                index=c.index,
                text=echo + c.message.reasoning + c.message.content,
                logprobs=None if c.logprobs is None else legacy_logprobs(c.logprobs, len(echo)),
                finish_reason=c.end.finish_reason,
            )
            for c in choices
        ]
        return encode(self._envelope(Completion, items, usage, nvext))
