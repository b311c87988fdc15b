"""The KV index: which workers cache which prompt prefixes. Pure, no I/O, no clock.

A radix tree over blocks whose edges are implicit: a block's *sequence* hash names its whole
prefix (``shared.hashing``), so the node for block ``i`` of a prompt is simply the key
``hashes[i]`` and its parent is ``hashes[i - 1]``. The tree is therefore one dict from sequence
hash to the set of workers holding that block (a bit set over worker slots), plus each worker's
set of blocks (for removal, clearing and snapshots). Matching walks a prompt's hashes from the
root and stops for a worker at its first missing block, exactly as a walk down Dynamo's
``RadixTree`` does.

``BlockStored`` under a parent this index has never seen is stored anyway (Dynamo 1.6.1 drops
such an event with "parent block not found"). Keying by sequence hash makes that safe: the orphan
can never inflate an overlap, because matching needs every block from the root, and once the
missing parent arrives (a later event or a dump) the chain is whole without a re-send.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from shared.messages import AllBlocksCleared, AnyKvEvent, BlockRemoved, BlockStored

SNAPSHOT_VERSION = 1


class WorkerBlocks(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One worker in a snapshot: the last ``event_id`` applied and every block it holds."""

    last_event_id: int
    block_hashes: list[int]


class IndexSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The index as of one stream sequence, as stored in the router object store."""

    version: int = SNAPSHOT_VERSION
    stream_seq: int
    """Every stream message up to and including this sequence is reflected."""
    workers: dict[str, WorkerBlocks]
    router_id: str = ""
    created_at: float = 0.0


class RadixIndex:
    """Sequence hash -> the workers caching that block (a bit set), with per-worker block sets.

    Each worker known here holds a slot, and a block's holders are one ``int`` with a bit per
    slot: the walk down a prompt tests and narrows its set of matching workers with a few
    machine-word operations per block, whatever the number of workers.
    """

    __slots__ = ("_bits_of", "_blocks_of", "_free", "_ids", "_mask_cache", "_slot")

    def __init__(self) -> None:
        self._bits_of: dict[int, int] = {}
        self._blocks_of: dict[str, set[int]] = {}
        self._slot: dict[str, int] = {}
        self._ids: list[str] = []
        """Slot -> worker id (a freed slot keeps its old id until reused; its bits are 0)."""
        self._free: list[int] = []
        self._mask_cache: dict[int, tuple[object, int]] = {}
        """id(key) -> (key, its bit set): ``bits_cached``; emptied when a slot changes."""

    def _bit(self, worker_id: str) -> int:
        slot = self._slot.get(worker_id)
        if slot is None:
            if self._free:
                slot = self._free.pop()
                self._ids[slot] = worker_id
            else:
                slot = len(self._ids)
                self._ids.append(worker_id)
            self._slot[worker_id] = slot
            self._mask_cache.clear()
        return 1 << slot

    # --- mutation ----------------------------------------------------------------------------
    def store(self, worker_id: str, block_hashes: Iterable[int]) -> None:
        """Record that ``worker_id`` caches these blocks (parents need not be known)."""
        bits_of = self._bits_of
        bit = self._bit(worker_id)
        mine = self._blocks_of.get(worker_id)
        if mine is None:
            mine = self._blocks_of[worker_id] = set()
        for h in block_hashes:
            bits_of[h] = bits_of.get(h, 0) | bit
            mine.add(h)

    def remove(self, worker_id: str, block_hashes: Iterable[int]) -> None:
        """Forget these blocks for ``worker_id``; unknown ones are ignored."""
        mine = self._blocks_of.get(worker_id)
        if mine is None:
            return
        bits_of = self._bits_of
        keep = ~(1 << self._slot[worker_id])
        for h in block_hashes:
            if h not in mine:
                continue
            mine.discard(h)
            left = bits_of[h] & keep
            if left:
                bits_of[h] = left
            else:
                del bits_of[h]

    def clear(self, worker_id: str) -> None:
        """Forget every block of ``worker_id`` (``AllBlocksCleared``); it stays known."""
        mine = self._blocks_of.get(worker_id)
        if mine:
            self.remove(worker_id, list(mine))

    def remove_worker(self, worker_id: str) -> bool:
        """Drop ``worker_id`` entirely; True when it was known."""
        self.clear(worker_id)
        slot = self._slot.pop(worker_id, None)
        if slot is not None:
            self._free.append(slot)
            self._mask_cache.clear()
        return self._blocks_of.pop(worker_id, None) is not None

    def apply(self, worker_id: str, event: AnyKvEvent) -> None:
        """Apply one KV cache event of ``worker_id``."""
        if isinstance(event, BlockStored):
            self.store(worker_id, event.block_hashes)
        elif isinstance(event, BlockRemoved):
            self.remove(worker_id, event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.clear(worker_id)
            self._blocks_of.setdefault(worker_id, set())
            self._bit(worker_id)

    def replace_worker(self, worker_id: str, block_hashes: Iterable[int]) -> None:
        """Make ``block_hashes`` the whole cache of ``worker_id`` (after a dump)."""
        self.clear(worker_id)
        self.store(worker_id, block_hashes)

    # --- queries -------------------------------------------------------------------------------
    def find_matches(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Overlap per worker: how many leading blocks of the prompt it caches (absent = 0)."""
        return {
            w: depth for depth, group in self.match_groups(block_hashes) for w in self.ids(group)
        }

    def match_groups(self, block_hashes: Sequence[int]) -> list[tuple[int, int]]:
        """The workers caching a prefix of the prompt, grouped by its length in blocks: ``(depth,
        bit set)``, shallowest first, none empty (``ids`` names a set's workers)."""
        groups: list[tuple[int, int]] = []
        bits_of = self._bits_of
        if not block_hashes:
            return groups
        active = bits_of.get(block_hashes[0], 0)
        if not active:
            return groups
        depth = 1
        for i in range(1, len(block_hashes)):
            holders = bits_of.get(block_hashes[i], 0)
            if holders & active != active:
                gone = active & ~holders
                groups.append((depth, gone))
                active &= holders
                if not active:
                    return groups
            depth += 1
        groups.append((depth, active))
        return groups

    def ids(self, bits: int) -> list[str]:
        """The workers of a bit set (in slot order)."""
        names = self._ids
        text = format(bits, "b")[::-1]  # bit i at index i
        out = []
        at = text.find("1")
        while at >= 0:
            out.append(names[at])
            at = text.find("1", at + 1)
        return out

    def bits(self, worker_ids: Iterable[str]) -> int:
        """The bit set of these workers (those unknown here are left out)."""
        slot = self._slot
        out = 0
        for worker_id in worker_ids:
            at = slot.get(worker_id)
            if at is not None:
                out |= 1 << at
        return out

    def bits_cached(self, key: object, worker_ids: Iterable[str]) -> int:
        """``bits(worker_ids)``, computed once while ``key`` (an immutable fleet) and the slots
        stay the same."""
        cached = self._mask_cache.get(id(key))
        if cached is not None and cached[0] is key:
            return cached[1]
        out = self.bits(worker_ids)
        if len(self._mask_cache) >= 64:  # fleets come and go: keep the recent ones
            self._mask_cache.clear()
        self._mask_cache[id(key)] = (key, out)
        return out

    def workers(self) -> list[str]:
        """Every worker the index knows, sorted."""
        return sorted(self._blocks_of)

    def blocks_of(self, worker_id: str) -> frozenset[int]:
        """The blocks ``worker_id`` caches."""
        return frozenset(self._blocks_of.get(worker_id, ()))

    def worker_blocks(self, worker_id: str) -> int:
        """How many blocks ``worker_id`` caches."""
        return len(self._blocks_of.get(worker_id, ()))

    @property
    def num_nodes(self) -> int:
        """Distinct blocks cached by at least one worker."""
        return len(self._bits_of)

    @property
    def num_entries(self) -> int:
        """(worker, block) pairs: the sum of every worker's cache size."""
        return sum(len(b) for b in self._blocks_of.values())

    def state(self) -> dict[str, frozenset[int]]:
        """Every worker's blocks (for comparing two indexes in tests)."""
        return {w: frozenset(b) for w, b in self._blocks_of.items()}

    # --- snapshots -----------------------------------------------------------------------------
    def snapshot(
        self,
        *,
        stream_seq: int,
        last_event_ids: dict[str, int],
        router_id: str = "",
        created_at: float = 0.0,
    ) -> IndexSnapshot:
        """The index plus each worker's last applied ``event_id``, as of ``stream_seq``."""
        ids = set(self._blocks_of) | set(last_event_ids)
        workers = {
            w: WorkerBlocks(
                last_event_id=last_event_ids.get(w, 0),
                block_hashes=sorted(self._blocks_of.get(w, ())),
            )
            for w in sorted(ids)
        }
        return IndexSnapshot(
            stream_seq=stream_seq, workers=workers, router_id=router_id, created_at=created_at
        )

    @classmethod
    def restore(cls, snapshot: IndexSnapshot) -> tuple[RadixIndex, dict[str, int]]:
        """An index rebuilt from ``snapshot``, and each worker's last applied ``event_id``."""
        if snapshot.version != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported router snapshot version {snapshot.version}")
        index = cls()
        for worker_id, entry in snapshot.workers.items():
            index.store(worker_id, entry.block_hashes)
        last = {w: e.last_event_id for w, e in snapshot.workers.items() if e.last_event_id}
        return index, last


def encode_snapshot(snapshot: IndexSnapshot) -> bytes:
    """MessagePack bytes of a snapshot."""
    return msgspec.msgpack.encode(snapshot)


def decode_snapshot(data: bytes) -> IndexSnapshot:
    """A snapshot from its MessagePack bytes."""
    return msgspec.msgpack.decode(data, type=IndexSnapshot)
