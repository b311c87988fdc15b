"""One request inside the simulated engine: its tokens, its block hashes and its next token.

Pure. Block hashes follow ``shared.hashing`` (Dynamo's scheme): local hashes use the request's
salted seed (LoRA name, ``cache_salt``), sequence hashes chain with seed 1337; the hashes of
generated blocks are computed one block at a time as tokens fill them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import xxhash

from services.mocker.kv_cache import BlockTable
from shared.hashing import SEED, block_hash, local_block_hashes, sequence_hashes
from shared.messages import SamplingParams

_PAIR = struct.Struct("<QQ")


def next_sequence_hash(parent: int | None, local: int) -> int:
    """The sequence hash of a block with local hash ``local`` after block ``parent``.

    The same chain as ``shared.hashing.sequence_hashes`` (a unit test holds them together),
    one step at a time, so a long generation never rehashes its whole prefix.
    """
    if parent is None:
        return local
    return xxhash.xxh3_64_intdigest(_PAIR.pack(parent, local), seed=SEED)


@dataclass(slots=True, kw_only=True, eq=False)
class EngineRequest:
    """One request inside the engine (compared by identity)."""

    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    eos_token_id: int | None
    cursor: int
    """Next corpus position to emit."""
    arrival_s: float
    block_size: int
    hash_seed: int = SEED
    """Local-hash seed (``shared.hashing.salted_seed``): salted tenants never share blocks."""
    lora_name: str | None = None
    choice: int = 0
    """Which of the request's ``n`` sequences this is (each is its own ``EngineRequest``)."""
    key: str = ""
    """The request's seed key with the choice: logprobs and scripts are functions of it."""
    script: tuple[int, ...] = ()
    """Structured output (``structured.Script``) emitted before any corpus token."""
    script_ends: bool = False
    """EOS right after ``script`` (else corpus prose follows it)."""
    script_pos: int = 0
    """Next ``script`` position to emit."""
    resumed: int = 0
    """Tokens generated before a migration (now the prompt's tail)."""
    finished: bool = False
    """This sequence emitted its last token (its siblings may still run)."""
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    """Tokens (prompt, then generated) whose KV is computed; the last sampled one is not."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache when the request was (last) admitted."""
    table: BlockTable = field(default_factory=BlockTable)
    prefill_only: bool = False
    """A disaggregated prefill phase: one token, then its prompt blocks stay pinned."""
    held: BlockTable | None = None
    """Disaggregated decode: the pulled (and already held) prompt blocks, referenced until the
    request is admitted and takes them as cache hits."""
    remote_prefill: bool = False
    """Disaggregated decode whose pull landed: the prefill worker computed the whole prompt, so
    once its blocks are here only the last prompt token is computed, in a decode step, as a vLLM
    decode instance behind a KV connector does (not a prefill of the partial last block)."""
    block_hashes: list[int] = field(default_factory=list)
    """Sequence hashes of the full blocks of ``prompt + output`` hashed so far."""
    mm: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Block index -> routing hashes of the prompt's images in it (``hashing.block_images``)."""

    num_tokens: int = 0
    """``len(prompt) + len(output)``, kept up to date by ``append`` (read on every step)."""

    def __post_init__(self) -> None:
        locals_ = local_block_hashes(self.prompt, self.block_size, self.hash_seed, self.mm)
        self.block_hashes = sequence_hashes(locals_)
        self.num_tokens = len(self.prompt) + len(self.output)

    def append(self, token: int) -> None:
        """Add a sampled token to the sequence."""
        self.output.append(token)
        self.num_tokens += 1

    @property
    def is_prefilling(self) -> bool:
        """True until the first token is sampled (a preempted request prefills again, though)."""
        return not self.output

    def tokens(self, start: int, end: int) -> tuple[int, ...]:
        """``(prompt + output)[start:end]`` without building the whole sequence."""
        p = len(self.prompt)
        if end <= p:
            return self.prompt[start:end]
        if start >= p:
            return tuple(self.output[start - p : end - p])
        return self.prompt[start:] + tuple(self.output[: end - p])

    def full_block_hashes(self, count: int) -> list[int]:
        """Sequence hashes of the first ``count`` full blocks (hashing new ones as needed)."""
        bs = self.block_size
        while len(self.block_hashes) < count:
            i = len(self.block_hashes)
            local = block_hash(
                self.tokens(i * bs, (i + 1) * bs), self.hash_seed, self.mm.get(i, ())
            )
            parent = self.block_hashes[-1] if self.block_hashes else None
            self.block_hashes.append(next_sequence_hash(parent, local))
        return self.block_hashes[:count]

    def skip_generated(self, corpus: tuple[int, ...], count: int) -> None:
        """Move past ``count`` tokens emitted before a migration (decision 017).

        None of them ended the request, so at each one a stop id was skipped and the corpus end
        wrapped around, as ``next_token`` does while the request may not stop.
        """
        stops = self.sampling.stop_token_ids
        self.resumed += count
        scripted = min(count, len(self.script) - self.script_pos)
        self.script_pos += scripted
        for _ in range(count - scripted):
            for _ in range(2 * len(corpus) + 1):
                if self.cursor >= len(corpus):
                    self.cursor = 0
                token = corpus[self.cursor]
                self.cursor += 1
                if token not in stops:
                    break

    def next_token(self, corpus: tuple[int, ...]) -> tuple[int, int | None]:
        """The next script token, then (a complete structured answer) EOS, or the next corpus
        token, or EOS at the corpus end; a stop id also returns itself."""
        sampling = self.sampling
        may_stop = len(self.output) >= sampling.min_tokens
        if self.script_pos < len(self.script):
            token = self.script[self.script_pos]
            self.script_pos += 1
            stop = token in sampling.stop_token_ids and may_stop
            return token, token if stop else None
        eos = self.eos_token_id
        if self.script_ends and may_stop and not sampling.ignore_eos and eos is not None:
            return eos, eos
        for _ in range(2 * len(corpus) + 1):
            if self.cursor >= len(corpus):
                if may_stop and not sampling.ignore_eos and self.eos_token_id is not None:
                    return self.eos_token_id, self.eos_token_id
                self.cursor = 0  # wrap around: ignore_eos, min_tokens, or no EOS known
            token = corpus[self.cursor]
            self.cursor += 1
            if token not in sampling.stop_token_ids:
                return token, None
            if may_stop:
                return token, token
            # min_tokens not reached: the stop id is suppressed, as vLLM masks its logit
        return corpus[0], None  # the corpus is nothing but stop ids: give up on skipping
