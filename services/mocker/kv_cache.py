"""Paged KV cache with prefix caching: full blocks shared by sequence hash, reference counts,
LRU eviction of free cached blocks, and the KV events each change produces.

Pure: no I/O, no clock. Like Dynamo's mocker ``KvManager``, a new block comes from never-used
capacity first and only then evicts the least recently freed cached block, so a cached prefix
stays as long as there is room. A request's blocks are freed tail first, so a prefix's last
block is evicted before its first one. Each data-parallel rank has a cache of its own, and its
events say which (``dp_rank``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.messages import AllBlocksCleared, AnyKvEvent, BlockRemoved, BlockStored


@dataclass(slots=True)
class BlockTable:
    """The blocks one request holds: committed full blocks (by hash) and reserved ones."""

    hashes: list[int] = field(default_factory=list)
    """Sequence hashes of the request's full, cached blocks, in prefix order."""
    reserved: int = 0
    """Blocks allocated for tokens not yet in a full cached block (the partial tail, chunks)."""

    @property
    def num_blocks(self) -> int:
        return len(self.hashes) + self.reserved


@dataclass(slots=True, eq=False)
class _Block:
    seq_hash: int
    parent: int | None
    tokens: tuple[int, ...]
    lora_name: str | None
    ref: int = 1


@dataclass(slots=True)
class _Stored:
    parent: int | None
    hashes: list[int]
    tokens: list[int]
    lora_name: str | None


class KvCache:
    """``num_blocks`` blocks of ``block_size`` tokens; full blocks cached by sequence hash."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        dp_rank: int = 0,
    ):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be at least 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.dp_rank = dp_rank
        """The data-parallel rank this cache belongs to (on every event it records)."""
        self._blocks: dict[int, _Block] = {}
        """Cached full blocks (in use or free), by sequence hash."""
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        """Cached blocks nobody references, least recently freed first (the eviction order)."""
        self._num_free = num_blocks
        """Blocks holding nothing at all."""
        self._num_reserved = 0
        self._events: list[_Stored | BlockRemoved | AllBlocksCleared] = []

    # --- queries ---------------------------------------------------------------------------------

    @property
    def used_blocks(self) -> int:
        """Blocks some request holds (cached ones in use plus reserved ones)."""
        return self.num_blocks - self._num_free - len(self._free_cached)

    @property
    def cached_blocks(self) -> int:
        """Full blocks a new request could reuse (in use or free)."""
        return len(self._blocks)

    def __contains__(self, seq_hash: int) -> bool:
        return seq_hash in self._blocks

    def match(self, seq_hashes: Sequence[int]) -> list[int]:
        """The leading ``seq_hashes`` the cache holds: the reusable prefix."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        for h in seq_hashes:
            if h not in self._blocks:
                break
            hits.append(h)
        return hits

    # --- commands --------------------------------------------------------------------------------

    def allocate(self, table: BlockTable, hits: Sequence[int], num_blocks: int) -> bool:
        """Grow ``table`` to ``num_blocks``: take ``hits`` (cached prefix) and reserve the rest.

        Evicts free cached blocks (LRU) when the never-used capacity runs out. Changes nothing
        and returns False when the blocks are not there (the scheduler then preempts or waits).
        """
        new = num_blocks - table.num_blocks - len(hits)
        if new <= 0 and not hits:
            return True
        revived = sum(1 for h in hits if self._blocks[h].ref == 0)
        if new > self._num_free + len(self._free_cached) - revived:
            return False
        for h in hits:
            self._ref(h)
        table.hashes.extend(hits)
        new = max(0, new)
        from_free = min(new, self._num_free)
        self._num_free -= from_free
        self._evict(new - from_free)
        table.reserved += new
        self._num_reserved += new
        return True

    def commit(
        self,
        table: BlockTable,
        seq_hash: int,
        parent: int | None,
        tokens: Sequence[int],
        lora_name: str | None = None,
    ) -> None:
        """Turn one reserved block of ``table`` into the full block ``seq_hash`` (cacheable).

        A block another request already stored is shared instead (the reserved one is freed);
        a new one is recorded as ``BlockStored``. Without prefix caching nothing is cached.
        """
        if not self.enable_prefix_caching or table.reserved < 1:
            return
        table.reserved -= 1
        self._num_reserved -= 1
        table.hashes.append(seq_hash)
        if seq_hash in self._blocks:
            self._ref(seq_hash)
            self._num_free += 1
            return
        self._blocks[seq_hash] = _Block(seq_hash, parent, tuple(tokens), lora_name)
        self._record_stored(seq_hash, parent, tokens, lora_name)

    def release(self, table: BlockTable) -> None:
        """Free every block of ``table``; its full blocks stay cached until evicted."""
        for h in reversed(table.hashes):  # tail first: evicted before the prefix it extends
            block = self._blocks[h]
            block.ref -= 1
            if block.ref == 0:
                self._free_cached[h] = None
        self._num_free += table.reserved
        self._num_reserved -= table.reserved
        table.hashes.clear()
        table.reserved = 0

    def clear(self) -> None:
        """Drop every free cached block and record ``AllBlocksCleared`` (start, reset).

        Blocks in use stay (vLLM refuses to reset then; the mocker only resets when idle).
        """
        for h in self._free_cached:
            del self._blocks[h]
        self._num_free += len(self._free_cached)
        self._free_cached.clear()
        self._events.append(AllBlocksCleared(dp_rank=self.dp_rank))

    def take_events(self) -> list[AnyKvEvent]:
        """The KV events recorded since the last call, in order (consecutive stores merged)."""
        if not self._events:
            return []
        out: list[AnyKvEvent] = []
        for e in self._events:
            if isinstance(e, _Stored):
                out.append(
                    BlockStored(
                        block_hashes=tuple(e.hashes),
                        parent_hash=e.parent,
                        token_ids=tuple(e.tokens),
                        block_size=self.block_size,
                        lora_name=e.lora_name,
                        dp_rank=self.dp_rank,
                    )
                )
            else:
                out.append(e)
        self._events.clear()
        return out

    def dump(self, *, with_tokens: bool = True) -> list[BlockStored]:
        """Every cached block as ``BlockStored`` events, parents before children.

        Chains are merged: one event per path from a branch point, so a dump of long shared
        prefixes stays small. A block whose parent was evicted starts a chain with that parent.
        """
        children: dict[int | None, list[_Block]] = {}
        for block in self._blocks.values():
            parent = block.parent if block.parent in self._blocks else None
            children.setdefault(parent, []).append(block)
        out: list[BlockStored] = []
        stack = list(reversed(children.get(None, [])))
        while stack:
            block = stack.pop()
            chain = [block]
            while kids := children.get(chain[-1].seq_hash):
                stack.extend(reversed(kids[1:]))
                chain.append(kids[0])
            out.append(
                BlockStored(
                    block_hashes=tuple(b.seq_hash for b in chain),
                    parent_hash=block.parent,
                    token_ids=tuple(t for b in chain for t in b.tokens) if with_tokens else (),
                    block_size=self.block_size,
                    lora_name=block.lora_name,
                    dp_rank=self.dp_rank,
                )
            )
        return out

    # --- internals -------------------------------------------------------------------------------

    def _ref(self, seq_hash: int) -> None:
        block = self._blocks[seq_hash]
        if block.ref == 0:
            del self._free_cached[seq_hash]
        block.ref += 1

    def _evict(self, count: int) -> None:
        if count <= 0:
            return
        evicted = []
        for _ in range(count):
            h, _none = self._free_cached.popitem(last=False)
            del self._blocks[h]
            evicted.append(h)
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockRemoved):
            merged = (*last.block_hashes, *evicted)
            self._events[-1] = BlockRemoved(block_hashes=merged, dp_rank=self.dp_rank)
        else:
            self._events.append(BlockRemoved(block_hashes=tuple(evicted), dp_rank=self.dp_rank))

    def _record_stored(
        self, seq_hash: int, parent: int | None, tokens: Sequence[int], lora_name: str | None
    ) -> None:
        last = self._events[-1] if self._events else None
        if (
            isinstance(last, _Stored)
            and last.hashes[-1] == parent
            and last.lora_name == lora_name
            and parent is not None
        ):
            last.hashes.append(seq_hash)
            last.tokens.extend(tokens)
            return
        self._events.append(_Stored(parent, [seq_hash], list(tokens), lora_name))
