"""Disaggregated serving inside the simulated engine: prefills' pinned blocks and decodes' pulls.
Pure: no I/O; times come from the engine's clock.

``Pins``: a finished prefill phase keeps its prompt's full blocks referenced (not evictable)
under its request id until released (its decode worker pulled them, or it was cancelled) or
until its timeout passes. Unpinning records no KV event: the blocks stay cached, now evictable.

``Pulls``: a decode phase takes a reference on the named blocks its cache already holds and
reserves room for the others (a cache without room pulls nothing: the request then computes
them as prefill), waits out the transfer (``transfer.pull_seconds``), and when it lands commits
the pulled blocks into the cache (``BlockStored`` events, as a vLLM decode instance's connector
writes them) and joins the waiting queue holding them, so the scheduler finds them as cache hits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.mocker import transfer
from services.mocker.kv_cache import BlockTable, KvCache
from services.mocker.sequence import EngineRequest


@dataclass(slots=True)
class _Pin:
    table: BlockTable
    expires_at: float


class Pins:
    """The pinned blocks of finished prefill phases, by request id."""

    def __init__(self, cache: KvCache, timeout_s: float) -> None:
        self._cache = cache
        self.timeout_s = timeout_s
        self.pins: dict[str, _Pin] = {}
        """Oldest first: with one timeout, insertion order is expiry order."""

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.pins

    @property
    def blocks(self) -> int:
        """Block references the pins hold."""
        return sum(len(p.table.hashes) for p in self.pins.values())

    @property
    def next_expiry(self) -> float | None:
        """When the oldest pin times out (None: no pin)."""
        return next(iter(self.pins.values())).expires_at if self.pins else None

    def pin(self, request_id: str, hashes: Sequence[int], now: float) -> None:
        """Reference ``hashes`` (cached blocks the request still holds) until released."""
        self.release(request_id)
        table = BlockTable()
        self._cache.allocate(table, hashes, len(hashes))  # all in use already: always fits
        self.pins[request_id] = _Pin(table, now + self.timeout_s)

    def release(self, request_id: str) -> bool:
        """Unpin a request's blocks; False if it has none pinned."""
        pin = self.pins.pop(request_id, None)
        if pin is None:
            return False
        self._cache.release(pin.table)
        return True

    def expire(self, now: float) -> list[str]:
        """Unpin every pin whose timeout has passed; their request ids."""
        expired = []
        for request_id, pin in self.pins.items():
            if pin.expires_at > now:
                break
            expired.append(request_id)
        for request_id in expired:
            self.release(request_id)
        return expired


@dataclass(slots=True, eq=False)
class Pull:
    """One decode phase waiting for its blocks."""

    request_id: str
    seqs: list[EngineRequest]
    table: BlockTable
    """The held blocks (referenced) and room reserved for the pulled ones."""
    own_hashes: list[int]
    """The prompt's full blocks' sequence hashes (the decode side's own)."""
    first: int
    """Index of the first block to pull (the ones before it are held here)."""
    count: int
    """Blocks to pull."""
    ready_at: float

    @property
    def covered_tokens(self) -> int:
        """Prompt tokens the request need not compute once the pull lands."""
        return (self.first + self.count) * self.seqs[0].block_size


class Pulls:
    """Decode phases pulling their blocks, by request id."""

    def __init__(self, cache: KvCache) -> None:
        self._cache = cache
        self.pending: dict[str, Pull] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.pending

    @property
    def next_ready(self) -> float | None:
        """When the next pull lands (None: none pending)."""
        return min((p.ready_at for p in self.pending.values()), default=None)

    def start(
        self,
        seqs: list[EngineRequest],
        params: Mapping[str, Any] | None,
        now: float,
        seconds: Callable[[int, Mapping[str, Any]], float],
    ) -> Pull:
        """Plan and start the pull of a decode phase (``seqs``: its sequences, not queued);
        ``seconds(blocks, params)``: how long pulling ``blocks`` takes."""
        seq = seqs[0]
        cache = self._cache
        own = seq.full_block_hashes(len(seq.prompt) // seq.block_size)
        named = transfer.named_blocks(params, own) if cache.enable_prefix_caching else 0
        held = cache.match(own[:named])
        count = named - len(held)
        table = BlockTable()
        if not cache.allocate(table, held, named):
            count = 0  # no room: nothing pulled, the request computes those blocks itself
        pull = Pull(
            request_id=seq.request_id,
            seqs=seqs,
            table=table,
            own_hashes=own,
            first=len(held),
            count=count,
            ready_at=now + seconds(count, params or {}),
        )
        self.pending[seq.request_id] = pull
        return pull

    def land(self, now: float) -> list[Pull]:
        """The pulls done by ``now``, their blocks committed to the cache; each request's first
        sequence holds them (``EngineRequest.held``) until admitted."""
        landed = [p for p in self.pending.values() if p.ready_at <= now]
        for pull in landed:
            del self.pending[pull.request_id]
            seq, own, bs = pull.seqs[0], pull.own_hashes, pull.seqs[0].block_size
            for i in range(pull.first, pull.first + pull.count):
                parent = own[i - 1] if i else None
                tokens = seq.tokens(i * bs, (i + 1) * bs)
                self._cache.commit(pull.table, own[i], parent, tokens, seq.lora_name)
            if pull.table.num_blocks:
                seq.held = pull.table
            for each in pull.seqs:
                each.remote_prefill = True
        return landed

    def cancel(self, request_id: str) -> Pull | None:
        """Stop a pull: its held blocks and reserved room are freed."""
        pull = self.pending.pop(request_id, None)
        if pull is not None:
            self._cache.release(pull.table)
        return pull
