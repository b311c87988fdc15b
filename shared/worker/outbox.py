"""Per-request token buffers that turn engine emissions into ``TokenBatch`` messages.

Pure: the service decides *when* to flush (first token and finish at once; otherwise every
step when sleeping, or when yielding to the event loop at speedup 0); this module decides
*what* each batch holds (index, prompt/cached tokens on the first, finish and stop id on the last,
one logprob per token). With ``n`` > 1 each choice has its own buffer, index and last batch.
A request on a data-parallel rank above 0, or the decode phase of a disaggregated one, stamps
its batches with where it ran (``dp_rank``, ``prefill_worker_id``, ``prefill_dp_rank``); any
other request's batches are built exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from shared.messages import FinishReason, TokenBatch, TokenLogprob
from shared.worker.records import Emission


@dataclass(slots=True)
class _Choice:
    """The buffer of one of a request's ``n`` sequences."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    index: int = 0
    """Position of ``tokens[0]`` in this choice's generated sequence."""
    has_sent: bool = False
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None
    sent_finish: bool = False

    @property
    def pending(self) -> bool:
        return bool(self.tokens) or (self.finish_reason is not None and not self.sent_finish)


@dataclass(slots=True)
class _Stream:
    stream_to: str
    prompt_tokens: int
    cached_tokens: int
    choices: list[_Choice]
    attempt: int = 0
    reply_to: str = ""
    """The gateway's subject (``Generate.reply_to``), told if the formatter is gone."""
    placement: tuple[int, str, int] | None = None
    """``(dp_rank, prefill_worker_id, prefill_dp_rank)`` for its batches; None: all defaults."""

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)


class Outbox:
    """Buffers tokens per open request and choice; ``take`` drains one choice into a batch."""

    def __init__(self, worker_id: str) -> None:
        self._worker_id = worker_id
        self._streams: dict[str, _Stream] = {}
        self._dirty: dict[str, None] = {}  # insertion-ordered set of ids with something to send

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._streams

    def __len__(self) -> int:
        return len(self._streams)

    def open(
        self,
        request_id: str,
        stream_to: str,
        *,
        prompt_tokens: int,
        cached_tokens: int = 0,
        attempt: int = 0,
        reply_to: str = "",
        n: int = 1,
        dp_rank: int = 0,
        prefill_worker_id: str = "",
        prefill_dp_rank: int = 0,
    ) -> None:
        """Start buffering for a request (``n`` choices) whose batches go to ``stream_to``;
        they name the rank that runs it and, disaggregated, the worker that prefilled it."""
        choices = [_Choice() for _ in range(max(1, n))]
        placement = None
        if dp_rank or prefill_worker_id:
            placement = (dp_rank, prefill_worker_id, prefill_dp_rank)
        self._streams[request_id] = _Stream(
            stream_to,
            prompt_tokens,
            cached_tokens,
            choices,
            attempt=attempt,
            reply_to=reply_to,
            placement=placement,
        )

    def attempt(self, request_id: str) -> int | None:
        """The ``Generate.attempt`` of an open request."""
        stream = self._streams.get(request_id)
        return stream.attempt if stream is not None else None

    def stream_to(self, request_id: str) -> str | None:
        """Where an open request's batches go (``None``: not open)."""
        stream = self._streams.get(request_id)
        return stream.stream_to if stream is not None else None

    def reply_to(self, request_id: str) -> str | None:
        """The gateway subject of an open request (``None``: not open, or none given)."""
        stream = self._streams.get(request_id)
        return stream.reply_to or None if stream is not None else None

    def add(self, emission: Emission) -> bool:
        """Buffer an emission; True when it should go out now (a choice's first batch or its
        last one). A ``cancelled`` emission ends every choice still running."""
        stream = self._streams.get(emission.request_id)
        if stream is None or not 0 <= emission.choice < len(stream.choices):
            return False
        choice = stream.choices[emission.choice]
        if choice.finish_reason is not None:
            return False  # cancelled or finished meanwhile: drop what the step produced
        pulled = stream.placement is not None and bool(stream.placement[1])
        if emission.cached_tokens and emission.choice == 0 and not pulled:
            # known once the engine admitted it; a decode phase keeps what its prefill worker
            # found cached (the blocks it pulled are not prefix-cache hits)
            stream.cached_tokens = emission.cached_tokens
        choice.tokens.extend(emission.token_ids)
        choice.logprobs.extend(emission.logprobs)
        if emission.finish_reason == "cancelled":
            for other in stream.choices:
                if other.finish_reason is None:
                    other.finish_reason = "cancelled"
        elif emission.finish_reason is not None:
            choice.finish_reason = emission.finish_reason
            choice.stop_token_id = emission.stop_token_id
        if emission.token_ids or emission.finish_reason is not None:
            self._dirty[emission.request_id] = None
        return not choice.has_sent or choice.finish_reason is not None

    def dirty(self) -> list[str]:
        """Requests with buffered tokens or a pending finish, oldest first."""
        return list(self._dirty)

    def take(self, request_id: str) -> tuple[str, TokenBatch] | None:
        """The batch of the request's first choice with something to send, and its subject;
        the request stays dirty while another choice has something too, and closes once every
        choice sent its last batch."""
        stream = self._streams.get(request_id)
        pending = [i for i, c in enumerate(stream.choices) if c.pending] if stream else []
        if stream is None or not pending:
            self._dirty.pop(request_id, None)
            return None
        number = pending[0]
        choice = stream.choices[number]
        if len(pending) == 1:
            self._dirty.pop(request_id, None)
        first = not choice.has_sent
        batch = TokenBatch(
            request_id=request_id,
            token_ids=tuple(choice.tokens),
            index=choice.index,
            finish_reason=choice.finish_reason,
            prompt_tokens=stream.prompt_tokens if first else 0,
            cached_tokens=stream.cached_tokens if first else 0,
            worker_id=self._worker_id,
            stop_token_id=choice.stop_token_id,
            attempt=stream.attempt,
            choice=number,
            logprobs=tuple(choice.logprobs),
        )
        if stream.placement is not None:
            dp_rank, prefill_worker_id, prefill_dp_rank = stream.placement
            batch = msgspec.structs.replace(
                batch,
                dp_rank=dp_rank,
                prefill_worker_id=prefill_worker_id,
                prefill_dp_rank=prefill_dp_rank,
            )
        choice.index += len(choice.tokens)
        choice.tokens = []
        choice.logprobs = []
        choice.has_sent = True
        if choice.finish_reason is not None:
            choice.sent_finish = True
            if all(c.sent_finish for c in stream.choices):
                del self._streams[request_id]
        return stream.stream_to, batch

    def close(self, request_id: str) -> None:
        """Forget a request without sending anything (it failed before generating)."""
        self._streams.pop(request_id, None)
        self._dirty.pop(request_id, None)
