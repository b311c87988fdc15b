"""Approximate KV index for ``--no-kv-events``: assume the chosen worker caches what it was sent.

Pure: the clock is passed in. Every routed prompt's blocks are recorded for the chosen worker
and forgotten ``ttl_s`` after they were last routed there (Dynamo's ``ApproxKvIndexer`` with
``--router-ttl``). Lookups use the same ``RadixIndex`` as the exact mode.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from services.router.indexer import RadixIndex

DEFAULT_TTL_S = 120.0


class ApproxIndex:
    """A ``RadixIndex`` whose entries expire ``ttl_s`` after their last use."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self.index = RadixIndex()
        self._expiry: dict[tuple[str, int], float] = {}
        self._queue: deque[tuple[float, str, Sequence[int]]] = deque()

    def remember(self, worker_id: str, block_hashes: Sequence[int], now: float) -> None:
        """The worker was sent these blocks at ``now``; keep them until ``now + ttl_s``."""
        if not block_hashes:
            return
        expires_at = now + self.ttl_s
        expiry = self._expiry
        for h in block_hashes:
            expiry[(worker_id, h)] = expires_at
        self.index.store(worker_id, block_hashes)
        self._queue.append((expires_at, worker_id, block_hashes))

    def expire(self, now: float) -> int:
        """Forget blocks whose last use is older than the TTL; returns how many."""
        dropped = 0
        queue, expiry = self._queue, self._expiry
        while queue and queue[0][0] <= now:
            _, worker_id, block_hashes = queue.popleft()
            gone = []
            for h in block_hashes:
                key = (worker_id, h)
                at = expiry.get(key)
                if at is not None and at <= now:  # not refreshed by a later route
                    del expiry[key]
                    gone.append(h)
            if gone:
                self.index.remove(worker_id, gone)
                dropped += len(gone)
        return dropped

    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker that left the registry."""
        for h in self.index.blocks_of(worker_id):
            self._expiry.pop((worker_id, h), None)
        return self.index.remove_worker(worker_id)

    def find_matches(self, block_hashes: Sequence[int]) -> dict[str, int]:
        return self.index.find_matches(block_hashes)
