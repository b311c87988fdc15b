"""The shaper contract: one request's pieces in, its protocol's bytes out (decision 019). Pure.

A shaper exists per output format (``OutputOptions.format``): OpenAI chat and completions,
Anthropic Messages, the Responses API, gRPC text and KServe. ``RequestFormatter`` feeds it:

- streaming: ``opening`` once (before any delta, even an empty one), ``delta`` per batch with
  new pieces for one choice, ``choice_end`` when a choice finishes, ``closing`` once after
  every choice ended;
- not streaming: ``body`` once with every choice whole.

``usage`` on ``delta`` / ``choice_end`` is given only with ``continuous_usage``. ``Usage`` and
``Nvext`` are ``shared.api_objects``' (the gateway documents the same Structs).

A shaper may also implement ``TextDeltas`` (the per-token fast path: plain text, no
log-probabilities, no usage); ``RequestFormatter`` then skips building pieces for such deltas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from services.formatter.pieces import ChoiceEnd, ChoiceResult, Piece, TokenLogprobs
from shared.api_objects import ResponseNvext as Nvext
from shared.api_objects import Usage, usage

__all__ = ["Nvext", "Shaper", "TextDeltas", "Usage", "usage"]


class Shaper(Protocol):
    """Bytes for one request's response in one protocol."""

    def opening(self, usage: Usage | None = None) -> bytes:
        """Streaming: the frames before the first token (OpenAI chat: each choice's role
        chunk; Anthropic: ``message_start``; Responses: ``response.created``…)."""

    def delta(
        self,
        choice: int,
        pieces: Sequence[Piece],
        logprobs: Sequence[TokenLogprobs] = (),
        usage: Usage | None = None,
    ) -> bytes:
        """Streaming: the frames for new pieces of one choice (``b""`` when there are none)."""

    def choice_end(self, choice: int, end: ChoiceEnd, usage: Usage | None = None) -> bytes:
        """Streaming: the frames that end one choice (its ``finish_reason``)."""

    def closing(self, usage: Usage, nvext: Nvext | None = None) -> bytes:
        """Streaming, after every choice ended: usage, ``[DONE]`` / ``message_stop``…"""

    def body(
        self, choices: Sequence[ChoiceResult], usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        """Not streaming: the whole response body."""


class TextDeltas(Protocol):
    """Optional, besides ``Shaper``: frames for plain answer text, without building pieces."""

    def text_delta(self, choice: int, text: str) -> bytes:
        """The same bytes as ``delta(choice, [Content(text)])`` (``text`` is not empty)."""
