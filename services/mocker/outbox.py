"""Per-request token buffers that turn engine emissions into ``TokenBatch`` messages.

Pure: the service decides *when* to flush (first token and finish at once; otherwise every
step when sleeping, or when yielding to the event loop at speedup 0); this module decides
*what* each batch holds (index, prompt/cached tokens on the first, finish and stop id on the last).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.mocker.engine import Emission
from shared.messages import FinishReason, TokenBatch


@dataclass(slots=True)
class _Stream:
    stream_to: str
    prompt_tokens: int
    cached_tokens: int
    tokens: list[int] = field(default_factory=list)
    index: int = 0
    """Position of ``tokens[0]`` in the generated sequence."""
    has_sent: bool = False
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None
    attempt: int = 0
    reply_to: str = ""
    """The gateway's subject (``Generate.reply_to``), told if the formatter is gone."""


class Outbox:
    """Buffers tokens per open request; ``take`` drains one request into a batch."""

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
    ) -> None:
        """Start buffering for a request whose batches go to ``stream_to``."""
        self._streams[request_id] = _Stream(
            stream_to, prompt_tokens, cached_tokens, attempt=attempt, reply_to=reply_to
        )

    def attempt(self, request_id: str) -> int | None:
        """The ``Generate.attempt`` of an open request."""
        stream = self._streams.get(request_id)
        return stream.attempt if stream is not None else None

    def reply_to(self, request_id: str) -> str | None:
        """The gateway subject of an open request (``None``: not open, or none given)."""
        stream = self._streams.get(request_id)
        return stream.reply_to or None if stream is not None else None

    def add(self, emission: Emission) -> bool:
        """Buffer an emission; True when it should go out now (first batch or the last one)."""
        stream = self._streams.get(emission.request_id)
        if stream is None or stream.finish_reason is not None:
            return False  # cancelled or finished meanwhile: drop what the step produced
        if emission.cached_tokens:
            stream.cached_tokens = emission.cached_tokens  # known once the engine admitted it
        stream.tokens.extend(emission.token_ids)
        if emission.finish_reason is not None:
            stream.finish_reason = emission.finish_reason
            stream.stop_token_id = emission.stop_token_id
        if emission.token_ids or emission.finish_reason is not None:
            self._dirty[emission.request_id] = None
        return not stream.has_sent or stream.finish_reason is not None

    def dirty(self) -> list[str]:
        """Requests with buffered tokens or a pending finish, oldest first."""
        return list(self._dirty)

    def take(self, request_id: str) -> tuple[str, TokenBatch] | None:
        """The request's buffered batch and its subject; closes the request when it finished."""
        self._dirty.pop(request_id, None)
        stream = self._streams.get(request_id)
        if stream is None or (not stream.tokens and stream.finish_reason is None):
            return None
        first = not stream.has_sent
        batch = TokenBatch(
            request_id=request_id,
            token_ids=tuple(stream.tokens),
            index=stream.index,
            finish_reason=stream.finish_reason,
            prompt_tokens=stream.prompt_tokens if first else 0,
            cached_tokens=stream.cached_tokens if first else 0,
            worker_id=self._worker_id,
            stop_token_id=stream.stop_token_id,
            attempt=stream.attempt,
        )
        stream.index += len(stream.tokens)
        stream.tokens = []
        stream.has_sent = True
        if stream.finish_reason is not None:
            del self._streams[request_id]
        return stream.stream_to, batch

    def close(self, request_id: str) -> None:
        """Forget a request without sending anything (it failed before generating)."""
        self._streams.pop(request_id, None)
        self._dirty.pop(request_id, None)
