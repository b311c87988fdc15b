"""vLLM KV events → JetServe KV events. Pure: records in, ``shared.messages`` events out.

vLLM names a block by its own hash (salted by the engine, and a different function in every
release); JetServe's routers look blocks up by ``shared.hashing`` sequence hashes. The relay
recomputes each stored block's JetServe hash from the tokens vLLM sends: the local hash of the
block's ids (seeded by ``shared.hashing.salted_seed`` of its LoRA and cache salt) chained onto
the JetServe hash of its parent, which it finds by the parent's vLLM hash. It keeps that map
(vLLM hash → JetServe hash, and the seed) for every block it has reported, so a removal is
reported under the JetServe hash of the block it removes, and forgets entries as vLLM evicts;
the same map answers a router's dump (``dump``).

What is not relayed, as Dynamo does not relay it (``lib/kv-router/src/zmq_wire/convert.rs``,
``create_stored_blocks``, read at commit 2bd0a36dcb371b2f22ad56aa48215e383aee02a0): blocks of
another block size than the worker's, and the blocks after a short ``token_ids``. Also not:
blocks of another medium than the GPU (CPU offload tiers) or of another KV cache group than
``group`` (hybrid models), and a stored run whose parent the relay does not know (it cannot be
hashed; its children are then unknown too).

Data parallelism: each of vLLM's data-parallel ranks is an engine core with its own cache, its
own publisher and its own hashes, so a relay follows one rank; every event it reports carries that
rank (``KvEvent.dp_rank``), the ``data_parallel_rank`` of vLLM's batch when the batch names one.

Sequence numbers: vLLM numbers batches from 0 per publisher. ``check`` says whether a batch is
the next one, an old one (already applied, skip), or past a gap (ask the publisher's replay
socket from the first missing number). A gap that replay cannot fill ends in ``lost``: the
relay forgets everything and reports ``AllBlocksCleared``, so routers undercount this worker
rather than believe in blocks it may have evicted unseen.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from services.vllm_worker.kv_wire import (
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEventBatch,
    VllmHash,
)
from services.vllm_worker.sampling import SALT_PREFIX
from shared.hashing import block_hash, salted_seed, sequence_hashes
from shared.messages import AllBlocksCleared, AnyKvEvent, BlockRemoved, BlockStored

__all__ = ["GPU", "Gap", "KvRelay", "SeqCheck"]

GPU = "GPU"
_HINTS = 4096


@dataclass(frozen=True, slots=True)
class Gap:
    """Batches are missing: replay from ``from_seq``."""

    from_seq: int


SeqCheck = Gap | bool
"""``True``: apply the batch; ``False``: already applied, skip it; ``Gap``: replay first."""


@dataclass(frozen=True, slots=True)
class _Known:
    jet_hash: int
    seed: int
    parent: int | None
    """The JetServe hash of the block before it (None at the root)."""
    tokens: tuple[int, ...]
    lora_name: str | None


class KvRelay:
    """One engine's KV events, renamed to JetServe hashes (see the module docstring)."""

    def __init__(self, *, block_size: int, group: int = 0, dp_rank: int = 0) -> None:
        self.block_size = block_size
        self.group = group
        self.dp_rank = dp_rank
        """The data-parallel rank whose cache this is (what its batches last said)."""
        self.next_seq = 0
        """The sequence number the next batch should carry."""
        self.dropped_blocks = 0
        """Blocks not relayed (another size, medium or group; an unknown parent)."""
        self._known: dict[VllmHash, _Known] = {}
        self._hints: OrderedDict[tuple[str | None, tuple[int, ...]], int] = OrderedDict()

    def __len__(self) -> int:
        """Blocks the relay can name (reported and not yet removed)."""
        return len(self._known)

    # --- sequence numbers ------------------------------------------------------------------------

    def check(self, seq: int) -> SeqCheck:
        """Whether the batch numbered ``seq`` is the next one (see ``SeqCheck``)."""
        if seq == self.next_seq:
            return True
        if seq < self.next_seq:
            return False
        return Gap(self.next_seq)

    def lost(self, resume_seq: int) -> list[AnyKvEvent]:
        """Batches before ``resume_seq`` are gone for good: forget every block, report
        ``AllBlocksCleared`` and go on from ``resume_seq``."""
        self._known.clear()
        self.next_seq = resume_seq
        return [AllBlocksCleared(dp_rank=self.dp_rank)]

    def apply(self, seq: int, batch: VllmEventBatch) -> list[AnyKvEvent]:
        """Relay batch ``seq`` (call only when ``check(seq)`` is True) and expect ``seq + 1``."""
        self.next_seq = seq + 1
        return self.relay(batch)

    # --- seeds -----------------------------------------------------------------------------------

    def hint(self, token_ids: tuple[int, ...], lora_name: str | None, hash_seed: int) -> None:
        """A request with these ids and this seed is about to run: a vLLM too old to send the
        cache salt in ``extra_keys`` is matched on its first block's ids instead."""
        if len(token_ids) < self.block_size or hash_seed == salted_seed(lora_name=lora_name):
            return
        key = (lora_name or None, tuple(token_ids[: self.block_size]))
        self._hints[key] = hash_seed
        self._hints.move_to_end(key)
        while len(self._hints) > _HINTS:
            self._hints.popitem(last=False)

    def _root_seed(self, event: VllmBlockStored) -> int:
        lora = event.lora_name or None
        for keys in event.extra_keys or ():
            for key in keys or ():
                if isinstance(key, str) and key.startswith(SALT_PREFIX):
                    try:
                        return int(key[len(SALT_PREFIX) :], 16)
                    except ValueError:
                        break
            break  # only the first block carries the salt
        hinted = self._hints.get((lora, tuple(event.token_ids[: self.block_size])))
        if hinted is not None:
            return hinted
        return salted_seed(lora_name=lora)

    def dump(self, *, with_tokens: bool) -> list[BlockStored]:
        """Every block the relay can name, as ``BlockStored`` events (a router's resync):
        parents before children, an unbranched run in one event; a block whose parent is gone
        starts a run that names it."""
        return _dump(list(self._known.values()), self.block_size, with_tokens, self.dp_rank)

    # --- events ----------------------------------------------------------------------------------

    def relay(self, batch: VllmEventBatch) -> list[AnyKvEvent]:
        """JetServe events for one batch, in order (no sequence check)."""
        if batch.data_parallel_rank is not None:
            self.dp_rank = batch.data_parallel_rank
        out: list[AnyKvEvent] = []
        for event in batch.events:
            if isinstance(event, VllmBlockStored):
                stored = self._stored(event)
                if stored is not None:
                    out.append(stored)
            elif isinstance(event, VllmBlockRemoved):
                removed = self._removed(event)
                if removed is not None:
                    out.append(removed)
            elif isinstance(event, VllmAllBlocksCleared):
                self._known.clear()
                out.append(AllBlocksCleared(dp_rank=self.dp_rank))
        return out

    def _ours(self, medium: str | None, group: int | None) -> bool:
        return (medium is None or medium == GPU) and (group is None or group == self.group)

    def _stored(self, event: VllmBlockStored) -> BlockStored | None:
        count = len(event.block_hashes)
        if not self._ours(event.medium, event.group_idx) or (
            event.kv_cache_spec_kind not in (None, "full_attention")
        ):
            self.dropped_blocks += count
            return None
        bs = self.block_size
        if event.block_size != bs:
            self.dropped_blocks += count
            return None
        full = min(count, len(event.token_ids) // bs)
        self.dropped_blocks += count - full
        if full == 0:
            return None
        if event.parent_block_hash is None:
            parent_jet: int | None = None
            seed = self._root_seed(event)
        else:
            known = self._known.get(event.parent_block_hash)
            if known is None:
                self.dropped_blocks += full
                return None
            parent_jet, seed = known.jet_hash, known.seed
        hashes: list[int] = []
        chain = parent_jet
        lora = event.lora_name or None
        for i in range(full):
            tokens = event.token_ids[i * bs : (i + 1) * bs]
            before, chain = chain, _next_hash(chain, block_hash(tokens, seed))
            hashes.append(chain)
            self._known[event.block_hashes[i]] = _Known(chain, seed, before, tokens, lora)
        return BlockStored(
            block_hashes=tuple(hashes),
            parent_hash=parent_jet,
            token_ids=tuple(event.token_ids[: full * bs]),
            block_size=bs,
            lora_name=lora,
            dp_rank=self.dp_rank,
        )

    def _removed(self, event: VllmBlockRemoved) -> BlockRemoved | None:
        if not self._ours(event.medium, event.group_idx):
            return None
        hashes = []
        for h in event.block_hashes:
            known = self._known.pop(h, None)
            if known is not None:
                hashes.append(known.jet_hash)
        return BlockRemoved(block_hashes=tuple(hashes), dp_rank=self.dp_rank) if hashes else None


def _dump(
    blocks: list[_Known], block_size: int, with_tokens: bool, dp_rank: int
) -> list[BlockStored]:
    """Blocks as ``BlockStored`` events, parents first, each unbranched run in one event."""
    present = {b.jet_hash for b in blocks}
    children: dict[int | None, list[_Known]] = {}
    for block in blocks:
        root = block.parent if block.parent in present else None
        children.setdefault(root, []).append(block)
    out: list[BlockStored] = []
    pending = list(reversed(children.get(None, [])))
    while pending:
        run = [pending.pop()]
        while kids := children.get(run[-1].jet_hash):
            pending.extend(reversed(kids[1:]))
            run.append(kids[0])
        out.append(
            BlockStored(
                block_hashes=tuple(b.jet_hash for b in run),
                parent_hash=run[0].parent,
                token_ids=tuple(t for b in run for t in b.tokens) if with_tokens else (),
                block_size=block_size,
                lora_name=run[0].lora_name,
                dp_rank=dp_rank,
            )
        )
    return out


def _next_hash(parent: int | None, local: int) -> int:
    """The JetServe sequence hash of a block with local hash ``local`` after ``parent``: one
    step of ``shared.hashing.sequence_hashes`` (whose second output chains its two inputs)."""
    if parent is None:
        return local
    return sequence_hashes([parent, local])[1]
