"""Replay history (decision 018): the chunks a formatter sent per request, to send again. Pure.

``ChunkHistory`` keeps one request's encoded ``ResponseChunk`` bytes in ``seq`` order, bounded
by bytes (the oldest dropped first); ``FinishedStreams`` keeps the histories of requests that
ended for a few seconds, bounded by count and bytes, so a lost last chunk can be sent again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import islice

REPLAY_MAX_BYTES = 1 << 20
"""Per request: chunks kept for replay. Past it the oldest go (a replay from before them leaves
a hole the gateway sees in ``StreamHeld.first_seq``); the newest chunk is always kept."""
FINISHED_KEEP_S = 10.0
"""How long an ended request's history is kept: its gateway may ask for a lost last chunk."""
FINISHED_MAX_REQUESTS = 4096
"""Ended requests kept at most (the oldest forgotten first)."""
FINISHED_MAX_BYTES = 64 << 20
"""Bytes of ended requests' histories kept at most, all together (the oldest forgotten first)."""


class ChunkHistory:
    """One request's chunks as sent: ``first_seq`` is the oldest still held, ``next_seq`` the
    number the next chunk gets. ``add`` costs one append (no copy: the bytes are the ones sent).
    """

    __slots__ = ("_chunks", "_max_bytes", "first_seq", "nbytes", "next_seq")

    def __init__(self, max_bytes: int = REPLAY_MAX_BYTES) -> None:
        self._chunks: deque[bytes] = deque()
        self._max_bytes = max_bytes
        self.first_seq = 0
        self.next_seq = 0
        self.nbytes = 0

    def add(self, encoded: bytes) -> None:
        """Keep chunk ``next_seq`` (already encoded with that number); drop the oldest past
        ``max_bytes``."""
        self._chunks.append(encoded)
        self.next_seq += 1
        self.nbytes += len(encoded)
        if self.nbytes > self._max_bytes:
            self._trim()

    def since(self, from_seq: int) -> list[bytes]:
        """The chunks from ``max(from_seq, first_seq)`` on, in order (a snapshot)."""
        skip = max(0, from_seq - self.first_seq)
        return list(islice(self._chunks, skip, None))

    def _trim(self) -> None:
        chunks = self._chunks
        while self.nbytes > self._max_bytes and len(chunks) > 1:
            self.nbytes -= len(chunks.popleft())
            self.first_seq += 1


@dataclass(frozen=True, slots=True)
class Finished:
    """An ended request: where its chunks went, what was sent, and when it ended."""

    reply_to: str
    history: ChunkHistory
    tail: bytes | None
    """An encoded ``RequestFailed`` sent after the chunks (the request failed), else ``None``."""
    ended_at: float

    @property
    def nbytes(self) -> int:
        return self.history.nbytes + (len(self.tail) if self.tail is not None else 0)

    def replay(self, from_seq: int) -> list[bytes]:
        """What to send again for a resume from ``from_seq``: the chunks, then the failure."""
        sent = self.history.since(from_seq)
        if self.tail is not None:
            sent.append(self.tail)
        return sent


class FinishedStreams:
    """Histories of ended requests for ``keep_s``, at most ``max_requests`` and ``max_bytes``."""

    __slots__ = ("_ended", "_keep_s", "_max_bytes", "_max_requests", "nbytes")

    def __init__(
        self,
        *,
        keep_s: float = FINISHED_KEEP_S,
        max_requests: int = FINISHED_MAX_REQUESTS,
        max_bytes: int = FINISHED_MAX_BYTES,
    ) -> None:
        self._keep_s = keep_s
        self._max_requests = max_requests
        self._max_bytes = max_bytes
        self._ended: OrderedDict[str, Finished] = OrderedDict()
        """Insertion order = end order, which ``prune`` relies on."""
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._ended)

    def add(
        self,
        request_id: str,
        reply_to: str,
        history: ChunkHistory,
        now: float,
        *,
        tail: bytes | None = None,
    ) -> None:
        """Keep an ended request's history (and its failure, if it failed)."""
        self._forget(request_id)
        finished = Finished(reply_to, history, tail, now)
        self._ended[request_id] = finished
        self.nbytes += finished.nbytes
        self.prune(now)

    def get(self, request_id: str, now: float) -> Finished | None:
        """The ended request, if it ended less than ``keep_s`` ago."""
        finished = self._ended.get(request_id)
        if finished is None or now - finished.ended_at >= self._keep_s:
            return None
        return finished

    def prune(self, now: float) -> None:
        """Forget requests ended ``keep_s`` ago or more, and the oldest past the bounds."""
        ended = self._ended
        while ended:
            request_id, oldest = next(iter(ended.items()))
            if (
                now - oldest.ended_at < self._keep_s
                and len(ended) <= self._max_requests
                and self.nbytes <= self._max_bytes
            ):
                break
            self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        finished = self._ended.pop(request_id, None)
        if finished is not None:
            self.nbytes -= finished.nbytes
