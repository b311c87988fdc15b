"""Simulated vLLM-like engine: waiting/running queues, a per-step token budget with chunked
prefill, a paged KV cache with prefix reuse, preemption by recompute, deterministic tokens.

Pure: no I/O, no real sleeping. The clock is injected, randomness comes from seeds, and
``step()`` returns what each request emitted plus how long the step would take on a GPU.
As in vLLM v1, every running request is scheduled ``tokens - computed`` new tokens (a prompt
chunk, or the one token to decode); a request that completes its tokens samples one more.

Disaggregated serving (``handoff``): a prefill phase samples one token, then its prompt blocks
stay pinned for the decode worker (``Emission.kv_transfer_params`` says which); a decode phase
first pulls the named blocks it lacks (not stepping meanwhile: other requests go on), then
queues as any request and prefills only the tail nobody computed. Until the first such request
arrives, steps pay one attribute check for this.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from services.mocker import structured, transfer
from services.mocker.handoff import Pins, Pulls
from services.mocker.kv_cache import KvCache
from services.mocker.logprobs import is_greedy, token_logprob
from services.mocker.records import EngineConfig, StepOutput
from services.mocker.sequence import EngineRequest
from services.mocker.timing import PolynomialTiming
from shared.hashing import SEED, MmSpan, block_hash, block_images
from shared.messages import AnyKvEvent, FinishReason, SamplingParams, TokenLogprob
from shared.worker.records import Emission, EngineError, EngineLoad, EnginePhase, EngineStats

__all__ = [
    "Emission",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineLoad",
    "EngineStats",
    "StepOutput",
]


class Engine:
    """Continuous batching over a waiting and a running queue; FCFS admission."""

    def __init__(
        self,
        config: EngineConfig,
        corpus: Sequence[int],
        *,
        timing: PolynomialTiming | None = None,
        clock: Callable[[], float] = time.monotonic,
        encode: structured.Encode | None = None,
        stats: EngineStats | None = None,
    ) -> None:
        """``encode``: the model's tokenizer, for structured output (``sampling.guided``);
        without it guided requests get corpus text. ``stats``: counters shared with other
        engines (a worker's data-parallel ranks)."""
        if not corpus:
            raise ValueError("the corpus must not be empty")
        self.config = config
        self.cache = KvCache(
            config.num_gpu_blocks,
            config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            dp_rank=config.dp_rank,
        )
        self.stats = stats if stats is not None else EngineStats()
        self.pins = Pins(self.cache, config.kv_pin_timeout_s)
        """Finished prefill phases' blocks, kept for their decode workers."""
        self.pulls = Pulls(self.cache)
        """Decode phases pulling their blocks (neither waiting nor running)."""
        self._disaggregated = False
        """A prefill or decode phase came: steps check pins and pulls from then on."""
        self._corpus = tuple(corpus)
        self._timing = timing or PolynomialTiming()
        self._clock = clock
        self._encode = encode
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []
        self._by_id: dict[str, list[EngineRequest]] = {}
        """A request's sequences still running or waiting (``n`` of them at first)."""

    # --- queries ---------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self.pulls.pending)

    @property
    def is_stepping(self) -> bool:
        """Some request can be scheduled (not only pulls in flight)."""
        return bool(self._waiting or self._running)

    @property
    def num_waiting(self) -> int:
        """Requests queued, pulling ones included (vLLM's waiting-for-remote-KV)."""
        return len(self._waiting) + len(self.pulls.pending)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def load(self) -> EngineLoad:
        """Queue lengths, KV blocks in use and prompt tokens still to prefill."""
        pending = sum(s.num_tokens - s.num_computed for s in self._waiting)
        pending += sum(len(s.prompt) - s.num_computed for s in self._running if s.is_prefilling)
        for pull in self.pulls.pending.values():
            pending += pull.seqs[0].num_tokens - pull.covered_tokens
        return EngineLoad(
            active=len(self._running),
            waiting=len(self._waiting) + len(self.pulls.pending),
            kv_used_blocks=self.cache.used_blocks,
            kv_total_blocks=self.cache.num_blocks,
            prefill_tokens=max(0, pending),
        )

    # --- commands --------------------------------------------------------------------------------

    def add(
        self,
        request_id: str,
        prompt: Sequence[int],
        sampling: SamplingParams,
        *,
        hash_seed: int = SEED,
        lora_name: str | None = None,
        resumed_tokens: int = 0,
        phase: EnginePhase = "both",
        kv_transfer: Mapping[str, Any] | None = None,
        images: Sequence[MmSpan] = (),
    ) -> None:
        """Queue a request; its output starts at a corpus offset drawn from its seed.

        ``sampling.n`` sequences are queued, one per choice, each at its own offset and seed
        (as vLLM v1 fans a parent request out): with prefix caching the later ones reuse the
        prompt blocks the first one computes. ``sampling.guided``: each sequence first emits
        the structured output ``structured.script`` writes for it.

        ``resumed_tokens``: the prompt's last tokens were generated before a migration; the
        output goes on from where they left off, as if the request had never moved (``n`` = 1
        only: a migration restarts one sequence).

        ``phase="prefill"``: one sequence, one token (``max_tokens`` ignored), then its prompt
        blocks are pinned and its last emission says how to pull them. ``phase="decode"``: the
        blocks ``kv_transfer`` (a prefill's ``kv_transfer_params``) names and this cache lacks
        are pulled first (``pulls``); the request queues once they are here.
        """
        if phase == "prefill":
            sampling = msgspec.structs.replace(sampling, max_tokens=1, n=1)
        if request_id in self._by_id:
            raise EngineError(f"request {request_id} is already in the engine")
        if not prompt:
            raise EngineError("the prompt must contain at least one token")
        if sampling.max_tokens < 1:
            raise EngineError("max_tokens must be at least 1")
        if len(prompt) + 1 > self.config.kv_capacity_tokens:
            raise EngineError("the prompt does not fit in the KV cache")
        if not 0 <= resumed_tokens < len(prompt):
            raise EngineError("resumed_tokens must be below the prompt length")
        if sampling.n < 1:
            raise EngineError("n must be at least 1")
        if resumed_tokens and sampling.n > 1:
            raise EngineError("a request with n > 1 cannot be resumed")
        original = prompt[: len(prompt) - resumed_tokens]
        mm = block_images(images, self.config.block_size) if images else {}
        seqs = []
        for choice in range(sampling.n):
            key = self.seed_key(original, sampling, choice)
            seq = EngineRequest(
                request_id=request_id,
                prompt=tuple(prompt),
                sampling=sampling,
                eos_token_id=self._eos_for(sampling),
                cursor=self.start_offset(original, sampling, choice),
                arrival_s=self._clock(),
                block_size=self.config.block_size,
                hash_seed=hash_seed,
                lora_name=lora_name,
                choice=choice,
                key=key,
                mm=mm,
            )
            if sampling.guided is not None and self._encode is not None:
                script = structured.script(sampling.guided, key, self._encode)
                if script is not None and script.ids:  # no ids: a tokenizer-less model
                    seq.script, seq.script_ends = script.ids, script.ends
            if resumed_tokens:
                seq.skip_generated(self._corpus, resumed_tokens)
            seqs.append(seq)
        self._by_id[request_id] = seqs
        self.stats.prompt_tokens += len(prompt)
        if phase == "both":
            self._waiting.extend(seqs)
            return
        self._disaggregated = True
        if phase == "prefill":
            seqs[0].prefill_only = True
            self._waiting.extend(seqs)
            return
        self.pulls.start(seqs, kv_transfer, self._clock(), self._pull_seconds)

    def release_pin(self, request_id: str) -> bool:
        """Unpin a finished prefill phase's blocks (pulled, or abandoned); False: none."""
        return self.pins.release(request_id)

    def expire_pins(self) -> list[str]:
        """Unpin the prefill phases whose pin timeout has passed; their request ids."""
        return self.pins.expire(self._clock()) if self.pins.pins else []

    def next_pull_at(self) -> float | None:
        """When the next pull lands, on the engine's clock (None: none pending)."""
        return self.pulls.next_ready

    def now(self) -> float:
        """The engine's clock."""
        return self._clock()

    def cancel(self, request_id: str) -> Emission | None:
        """Remove a request (all its choices) at once; the final (empty) emission says
        ``cancelled`` for every choice still running."""
        seqs = self._by_id.get(request_id)
        if seqs is None:
            return None
        first = seqs[0]
        if self.pulls.pending and self.pulls.cancel(request_id) is not None:
            del self._by_id[request_id]  # cancelled while pulling: never queued
        else:
            for seq in list(seqs):
                self._free(seq)
        return Emission(
            request_id=request_id,
            token_ids=(),
            index=len(first.output),
            finish_reason="cancelled",
            prompt_tokens=len(first.prompt),
            choice=first.choice,
            done=True,
        )

    def cancel_all(self) -> list[Emission]:
        """Cancel every request (shutdown)."""
        return [e for rid in list(self._by_id) if (e := self.cancel(rid)) is not None]

    def reset_cache(self) -> None:
        """Drop every free cached block; records ``AllBlocksCleared`` (called at start)."""
        self.cache.clear()

    def take_kv_events(self) -> list[AnyKvEvent]:
        """KV events (stored, removed, cleared) since the last call, in order."""
        return self.cache.take_events()

    def step(self) -> StepOutput:
        """Schedule within the budget, compute each scheduled chunk, emit completed requests."""
        pulled: tuple[tuple[str, int], ...] = ()
        if self._disaggregated:
            pulled = self._handoffs()
        emissions: list[Emission] = []
        finished: list[EngineRequest] = []
        prefill_tokens = decode_seqs = 0
        decode_kv = emit_kv = 0  # KV tokens the step's decodes (or all its emitters) attend to
        for seq, n, decoding in self._schedule():
            if decoding:
                decode_seqs += 1
                decode_kv += seq.num_computed
            else:
                prefill_tokens += n  # a prompt chunk, or a recompute after preemption
            if seq.num_computed == seq.num_tokens:
                emit_kv += seq.num_computed
                emissions.append(self._emit(seq))
                if seq.finished:
                    finished.append(seq)
        duration_s = prefill_s = 0.0
        if self.config.speedup_ratio > 0:
            prefill_s = self._timing.prefill_ms(prefill_tokens) / 1000.0 / self.config.speedup_ratio
            duration_s = self._timing.step_s(
                prefill_tokens=prefill_tokens,
                decode_seqs=len(emissions) if self.config.first_token_decodes else decode_seqs,
                active_kv_tokens=emit_kv if self.config.first_token_decodes else decode_kv,
                total_kv_tokens=self.config.kv_capacity_tokens,
                speedup_ratio=self.config.speedup_ratio,
            )
        for seq in finished:
            self._free(seq)
        return StepOutput(emissions, duration_s, prefill_tokens, decode_seqs, prefill_s, pulled)

    # --- disaggregated serving ---------------------------------------------------------------

    def _handoffs(self) -> tuple[tuple[str, int], ...]:
        """Before a step: free timed-out pins, queue the decode phases whose pulls landed."""
        now = self._clock()
        if self.pins.pins:
            self.pins.expire(now)
        if not self.pulls.pending:
            return ()
        landed = self.pulls.land(now)
        for pull in landed:
            self._waiting.extend(pull.seqs)
        return tuple((p.request_id, p.count) for p in landed)

    def _pull_seconds(self, blocks: int, params: Mapping[str, Any]) -> float:
        block_bytes = params.get("block_bytes")
        config = self.config
        return transfer.pull_seconds(
            blocks,
            block_bytes=block_bytes if isinstance(block_bytes, int) else config.kv_block_bytes,
            bandwidth_gbps=config.kv_transfer_bandwidth_gbps,
            latency_ms=config.kv_transfer_latency_ms,
            speedup_ratio=config.speedup_ratio,
        )

    def _hand_over(self, seq: EngineRequest, emission: Emission) -> Emission:
        """A prefill phase's last emission: pin its prompt blocks, say how to pull them."""
        hashes = seq.table.hashes[: len(seq.prompt) // seq.block_size]
        self.pins.pin(seq.request_id, hashes, self._clock())
        config = self.config
        params = transfer.handle(
            hashes,
            block_size=seq.block_size,
            block_bytes=config.kv_block_bytes,
            dp_rank=config.dp_rank,
        )
        return dataclasses.replace(emission, kv_transfer_params=params)

    # --- internals -------------------------------------------------------------------------------

    def start_offset(self, prompt: Sequence[int], sampling: SamplingParams, choice: int = 0) -> int:
        """Corpus offset in the first half, from (engine seed, request seed or prompt hash,
        choice)."""
        rng = random.Random(self.seed_key(prompt, sampling, choice))
        return rng.randrange(max(1, len(self._corpus) // 2))

    def seed_key(self, prompt: Sequence[int], sampling: SamplingParams, choice: int = 0) -> str:
        """(engine seed, request seed or prompt hash, choice): what a sequence's output is a
        function of. Greedy sampling has one answer, so its ``n`` choices are one sequence
        (vLLM's n greedy sequences are identical)."""
        key = sampling.seed if sampling.seed is not None else f"p{block_hash(prompt)}"
        own = choice and not is_greedy(sampling)
        return f"{self.config.seed}:{key}" + (f":{choice}" if own else "")

    def _eos_for(self, sampling: SamplingParams) -> int | None:
        if sampling.stop_token_ids:
            return sampling.stop_token_ids[0]
        return self.config.eos_token_ids[0] if self.config.eos_token_ids else None

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def _schedule(self) -> list[tuple[EngineRequest, int, bool]]:
        """Running requests first (preempting the newest when blocks run out), then admit.

        Each scheduled chunk is taken at once (``_take``): its full blocks become cacheable
        before the next request is matched, so a request admitted in the same step as another
        with its prefix reuses those blocks (vLLM v1 caches blocks when it schedules them; the
        KV of one forward pass is written layer by layer before attention reads it).
        Returns (request, tokens, is a decode) triples.
        """
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[EngineRequest, int, bool]] = []
        has_preempted = False
        i = 0
        bs = self.config.block_size
        while i < len(self._running) and budget > 0:
            seq = self._running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            table = seq.table
            if seq.num_computed + n <= (len(table.hashes) + table.reserved) * bs:
                scheduled.append(self._take(seq, n))  # fast path: the blocks it holds have room
                budget -= n
                i += 1
                continue
            need = self._blocks_for(seq.num_computed + n)
            while not self.cache.allocate(table, (), need):
                has_preempted = True
                victim = self._running.pop()
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                scheduled.append(self._take(seq, n))
                budget -= n
                i += 1
                continue
            break
        if has_preempted:
            return scheduled  # as vLLM: no admission in a step that had to preempt
        while self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs:
            seq = self._waiting[0]
            # Reuse at most tokens - 1: the last token must be computed to sample the next one.
            full = (seq.num_tokens - 1) // seq.block_size
            hits = self.cache.match(seq.full_block_hashes(full))
            computed = cached = len(hits) * seq.block_size
            if seq.remote_prefill and seq.is_prefilling and len(hits) == full:
                computed = seq.num_tokens - 1  # the prefill worker's, partial block included
            n = min(seq.num_tokens - computed, budget)
            if not self.cache.allocate(seq.table, hits, self._blocks_for(computed + n)):
                break  # FCFS: wait until running requests free blocks
            self._waiting.popleft()
            self._running.append(seq)
            if seq.held is not None:  # a decode phase's pulled blocks: now in its own table
                self.cache.release(seq.held)
                seq.held = None
            seq.num_computed = computed
            if seq.is_prefilling:
                seq.cached_tokens = cached
                self.stats.cache_hit_tokens += cached
            scheduled.append(self._take(seq, n))
            budget -= n
        return scheduled

    def _take(self, seq: EngineRequest, n: int) -> tuple[EngineRequest, int, bool]:
        """Compute ``n`` tokens of ``seq`` in this step and commit the blocks they fill."""
        last = n == 1 and seq.num_computed + 1 == seq.num_tokens
        decoding = last and (bool(seq.output) or seq.remote_prefill)
        seq.num_computed += n
        if seq.num_computed // seq.block_size > len(seq.table.hashes):
            self._commit_full_blocks(seq)
        return seq, n, decoding

    def _preempt(self, seq: EngineRequest) -> None:
        """Recompute preemption: free the request's blocks and put it first in line again."""
        self.cache.release(seq.table)
        seq.num_computed = 0
        self._waiting.appendleft(seq)
        self.stats.preemptions += 1

    def _commit_full_blocks(self, seq: EngineRequest) -> None:
        """Make the blocks the step filled cacheable (prompt and generated blocks alike)."""
        if not self.cache.enable_prefix_caching:
            return  # blocks stay reserved; nothing is shared or published
        table, bs = seq.table, seq.block_size
        full = seq.num_computed // bs
        if len(table.hashes) >= full:
            return
        hashes = seq.full_block_hashes(full)
        for i in range(len(table.hashes), full):
            parent = hashes[i - 1] if i else None
            tokens = seq.tokens(i * bs, (i + 1) * bs)
            self.cache.commit(table, hashes[i], parent, tokens, seq.lora_name)

    def _emit(self, seq: EngineRequest) -> Emission:
        index = len(seq.output)
        position = seq.resumed + index  # in the sequence as first generated (migrations)
        token, stop_id = seq.next_token(self._corpus)
        seq.append(token)
        finish: FinishReason | None = None
        if stop_id is not None:
            finish = "stop"
        elif len(seq.output) >= seq.sampling.max_tokens:
            finish = "length"
        elif seq.num_tokens > self.config.kv_capacity_tokens:
            finish = "length"  # the next token's KV would not fit even with the cache to itself
        done = False
        if finish is not None:
            seq.finished = True
            done = all(s.finished for s in self._by_id[seq.request_id])
        sampling = seq.sampling
        logprobs: tuple[TokenLogprob, ...] = ()
        if sampling.logprobs is not None:
            logprob = token_logprob(
                token,
                key=seq.key,
                position=position,
                k=sampling.logprobs,
                greedy=is_greedy(sampling),
                vocabulary=self._corpus,
            )
            logprobs = (logprob,)
        emission = Emission(
            request_id=seq.request_id,
            token_ids=(token,),
            index=index,
            finish_reason=finish,
            stop_token_id=stop_id,
            prompt_tokens=len(seq.prompt) if index == 0 else 0,
            cached_tokens=seq.cached_tokens if index == 0 else 0,
            choice=seq.choice,
            logprobs=logprobs,
            done=done,
        )
        if seq.prefill_only and finish is not None:
            return self._hand_over(seq, emission)
        return emission

    def _free(self, seq: EngineRequest) -> None:
        seqs = self._by_id[seq.request_id]
        seqs.remove(seq)
        if not seqs:
            del self._by_id[seq.request_id]
        if seq in self._running:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        if seq.held is not None:
            self.cache.release(seq.held)
            seq.held = None
        self.cache.release(seq.table)
