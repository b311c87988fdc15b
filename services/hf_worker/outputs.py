"""Continuous-batching outputs → ``Emission``s, and the KV-usage estimate. Pure: no torch.

transformers' manager reports a streaming request's state as a ``GenerationOutput`` whose
``generated_tokens`` is everything generated so far (not a delta) and whose ``status`` says
whether it has finished (``FINISHED`` = 3) or failed (``FAILED`` = 4, with ``error``). The engine
copies the few fields it needs into an ``OutputView`` in the manager's thread-free callback and
hands it to ``RequestCursor.advance``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shared.messages import FinishReason
from shared.worker.records import Emission

__all__ = ["FINISHED", "EngineFailed", "OutputView", "RequestCursor", "blocks_in_use", "view"]

FINISHED = 3
"""``RequestStatus.FINISHED``; ``FAILED`` is 4 (``GenerationOutput.is_finished``: ``>= 3``)."""


@dataclass(frozen=True, slots=True)
class OutputView:
    """What the engine reads from one ``GenerationOutput``."""

    generated: tuple[int, ...]
    status: int
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.status >= FINISHED


class EngineFailed(RuntimeError):
    """The manager failed the request (its error text is the message)."""


@dataclass(slots=True)
class RequestCursor:
    """How much of one request has been emitted; turns cumulative outputs into deltas."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    stop_ids: frozenset[int]
    emitted: int = 0
    done: bool = False

    def advance(self, output: OutputView) -> Emission | None:
        """The emission for ``output`` (None: nothing new); ``EngineFailed`` for a failure."""
        if self.done:
            return None
        if output.error is not None or output.status > FINISHED:
            raise EngineFailed(output.error or "the request failed in the engine")
        new = output.generated[self.emitted :]
        if not new and not output.finished:
            return None
        first = self.emitted == 0
        index = self.emitted
        self.emitted += len(new)
        if not output.finished:
            return Emission(
                request_id=self.request_id,
                token_ids=new,
                index=index,
                prompt_tokens=self.prompt_tokens if first else 0,
            )
        self.done = True
        last = output.generated[-1] if output.generated else None
        stopped = last is not None and last in self.stop_ids
        short = len(output.generated) < self.max_tokens
        reason: FinishReason = "stop" if stopped or short else "length"
        return Emission(
            request_id=self.request_id,
            token_ids=new,
            index=index,
            finish_reason=reason,
            stop_token_id=last if stopped else None,
            prompt_tokens=self.prompt_tokens if first else 0,
            done=True,
        )


def blocks_in_use(lengths: Iterable[int], block_size: int) -> int:
    """KV blocks the running sequences of ``lengths`` tokens hold (no prefix sharing counted)."""
    return sum(-(-n // block_size) for n in lengths if n > 0)


def view(generated: Sequence[int], status: int, error: str | None) -> OutputView:
    """An ``OutputView`` from a ``GenerationOutput``'s fields (copied: the manager reuses none,
    but the engine keeps the view past the callback)."""
    return OutputView(tuple(generated), int(status), error)
