"""Engine-process outputs → ``Emission``s, and the KV-usage estimate. Pure: no torch.

transformers' manager reports a streaming request's state cumulatively; the engine process sends
each step's *new* tokens (``core_wire.CoreOutput``: the new tokens, how many in all, the status:
``FINISHED`` = 3, ``FAILED`` = 4 with ``error``). ``merged`` joins the outputs of one request that
queued up while the worker was busy; ``RequestCursor.advance`` turns them into ``Emission``s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from services.hf_worker.core_wire import CoreOutput
from shared.messages import FinishReason
from shared.worker.records import Emission, EngineError

__all__ = ["FINISHED", "EngineFailed", "RequestCursor", "blocks_in_use", "merged"]

FINISHED = 3
"""``RequestStatus.FINISHED``; ``FAILED`` is 4 (``GenerationOutput.is_finished``: ``>= 3``)."""


class EngineFailed(RuntimeError):
    """The manager failed the request (its error text is the message)."""


def is_final(output: CoreOutput) -> bool:
    return output.status >= FINISHED or output.error is not None


def merged(older: CoreOutput, newer: CoreOutput) -> CoreOutput:
    """One output for two consecutive ones of a request (``newer``'s status and error)."""
    return CoreOutput(
        request_id=newer.request_id,
        new_tokens=older.new_tokens + newer.new_tokens,
        total=newer.total,
        status=newer.status,
        error=newer.error,
    )


@dataclass(slots=True)
class RequestCursor:
    """How much of one request has been emitted; turns outputs into ``Emission``s."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    stop_ids: frozenset[int]
    emitted: int = 0
    last_token: int | None = None
    done: bool = False

    def advance(self, output: CoreOutput) -> Emission | None:
        """The emission for ``output`` (None: nothing new); ``EngineFailed`` for a failure,
        ``EngineError`` (a 400) for a request the engine refused."""
        if self.done:
            return None
        if output.refused:
            raise EngineError(output.error or "the engine refused the request")
        if output.error is not None or output.status > FINISHED:
            raise EngineFailed(output.error or "the request failed in the engine")
        new = output.new_tokens
        finished = output.status >= FINISHED
        if not new and not finished:
            return None
        first = self.emitted == 0
        index = self.emitted
        self.emitted += len(new)
        if new:
            self.last_token = new[-1]
        prompt_tokens = self.prompt_tokens if first else 0
        if not finished:
            return Emission(
                request_id=self.request_id, token_ids=new, index=index, prompt_tokens=prompt_tokens
            )
        self.done = True
        last = self.last_token
        stopped = last is not None and last in self.stop_ids
        short = output.total < self.max_tokens
        reason: FinishReason = "stop" if stopped or short else "length"
        return Emission(
            request_id=self.request_id,
            token_ids=new,
            index=index,
            finish_reason=reason,
            stop_token_id=last if stopped else None,
            prompt_tokens=prompt_tokens,
            done=True,
        )


def blocks_in_use(lengths: Iterable[int], block_size: int) -> int:
    """KV blocks the running sequences of ``lengths`` tokens hold (no prefix sharing counted)."""
    return sum(-(-n // block_size) for n in lengths if n > 0)
