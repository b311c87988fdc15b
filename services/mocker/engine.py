"""Simulated vLLM-like engine: waiting/running queues, a per-step token budget with chunked
prefill, one token per running decode request per step, deterministic tokens from a corpus.

Pure: no I/O, no real sleeping. The clock is injected, randomness comes from seeds, and
``step()`` returns what each request emitted plus how long the step would take on a GPU.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from services.mocker.timing import PolynomialTiming
from shared.hashing import block_hash
from shared.messages import FinishReason, SamplingParams


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Scheduler limits and the simulated GPU's KV capacity."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_gpu_blocks: int = 16384
    seed: int = 0
    speedup_ratio: float = 1.0
    eos_token_ids: tuple[int, ...] = ()
    """The model's EOS ids; the first ends text at the corpus end when a request names none."""

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


@dataclass(frozen=True, slots=True, kw_only=True)
class Emission:
    """What one request produced in one step (or on cancel)."""

    request_id: str
    token_ids: tuple[int, ...]
    index: int
    """Position of ``token_ids[0]`` in the request's generated sequence."""
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class StepOutput:
    """The result of one ``step()``: emissions in running order and the simulated duration."""

    emissions: list[Emission]
    duration_s: float
    prefill_tokens: int
    decode_seqs: int


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
    num_computed: int = 0
    """Prompt tokens prefilled so far (chunked prefill advances this)."""
    output: list[int] = field(default_factory=list)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < len(self.prompt)

    @property
    def kv_tokens(self) -> int:
        return self.num_computed + len(self.output)


class EngineError(ValueError):
    """A request the engine can never run (empty prompt, larger than the KV cache, ...)."""


class Engine:
    """Continuous batching over a waiting and a running queue; FCFS admission."""

    def __init__(
        self,
        config: EngineConfig,
        corpus: Sequence[int],
        *,
        timing: PolynomialTiming | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not corpus:
            raise ValueError("the corpus must not be empty")
        self.config = config
        self._corpus = tuple(corpus)
        self._timing = timing or PolynomialTiming()
        self._clock = clock
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []
        self._by_id: dict[str, EngineRequest] = {}

    # --- queries ---------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def active_kv_tokens(self) -> int:
        return sum(s.kv_tokens for s in self._running)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    # --- commands --------------------------------------------------------------------------------

    def add(self, request_id: str, prompt: Sequence[int], sampling: SamplingParams) -> None:
        """Queue a request; its output starts at a corpus offset drawn from its seed."""
        if request_id in self._by_id:
            raise EngineError(f"request {request_id} is already in the engine")
        if not prompt:
            raise EngineError("the prompt must contain at least one token")
        if sampling.max_tokens < 1:
            raise EngineError("max_tokens must be at least 1")
        if self._blocks_for(len(prompt) + 1) > self.config.num_gpu_blocks:
            raise EngineError("the prompt does not fit in the KV cache")
        seq = EngineRequest(
            request_id=request_id,
            prompt=tuple(prompt),
            sampling=sampling,
            eos_token_id=self._eos_for(sampling),
            cursor=self.start_offset(prompt, sampling),
            arrival_s=self._clock(),
        )
        self._waiting.append(seq)
        self._by_id[request_id] = seq

    def cancel(self, request_id: str) -> Emission | None:
        """Remove a request at once; the final (empty) emission says ``cancelled``."""
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return None
        if seq in self._running:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        return Emission(
            request_id=request_id,
            token_ids=(),
            index=len(seq.output),
            finish_reason="cancelled",
            prompt_tokens=len(seq.prompt),
        )

    def cancel_all(self) -> list[Emission]:
        """Cancel every request (shutdown)."""
        return [e for rid in list(self._by_id) if (e := self.cancel(rid)) is not None]

    def step(self) -> StepOutput:
        """Schedule within the budget, advance prefill chunks, emit one token per decode."""
        scheduled = self._schedule()
        emissions: list[Emission] = []
        prefill_tokens = 0
        decode_seqs = 0
        for seq, num_tokens in scheduled:
            if seq.is_prefilling:
                seq.num_computed += num_tokens
                prefill_tokens += num_tokens
                if seq.is_prefilling:
                    continue  # chunked: more prompt left for the next step
            else:
                decode_seqs += 1
            emissions.append(self._emit(seq))
        duration_s = self._timing.step_s(
            prefill_tokens=prefill_tokens,
            decode_seqs=decode_seqs,
            active_kv_tokens=self.active_kv_tokens,
            total_kv_tokens=self.config.kv_capacity_tokens,
            speedup_ratio=self.config.speedup_ratio,
        )
        for e in emissions:
            if e.finish_reason is not None:
                self._free(e.request_id)
        return StepOutput(emissions, duration_s, prefill_tokens, decode_seqs)

    # --- internals -------------------------------------------------------------------------------

    def start_offset(self, prompt: Sequence[int], sampling: SamplingParams) -> int:
        """Corpus offset in the first half, from (engine seed, request seed or prompt hash)."""
        key = sampling.seed if sampling.seed is not None else f"p{block_hash(prompt)}"
        rng = random.Random(f"{self.config.seed}:{key}")
        return rng.randrange(max(1, len(self._corpus) // 2))

    def _eos_for(self, sampling: SamplingParams) -> int | None:
        if sampling.stop_token_ids:
            return sampling.stop_token_ids[0]
        return self.config.eos_token_ids[0] if self.config.eos_token_ids else None

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def _schedule(self) -> list[tuple[EngineRequest, int]]:
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[EngineRequest, int]] = []
        for seq in self._running:
            if budget <= 0:
                break
            n = min(len(seq.prompt) - seq.num_computed, budget) if seq.is_prefilling else 1
            scheduled.append((seq, n))
            budget -= n
        used_blocks = sum(
            self._blocks_for(len(s.prompt) + len(s.output) + 1) for s in self._running
        )
        while self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs:
            seq = self._waiting[0]
            need = self._blocks_for(len(seq.prompt) + 1)
            if used_blocks + need > self.config.num_gpu_blocks:
                break  # FCFS: wait until running requests free their blocks
            self._waiting.popleft()
            self._running.append(seq)
            used_blocks += need
            n = min(len(seq.prompt), budget)
            scheduled.append((seq, n))
            budget -= n
        return scheduled

    def _emit(self, seq: EngineRequest) -> Emission:
        index = len(seq.output)
        token, stop_id = self._next_token(seq)
        seq.output.append(token)
        finish: FinishReason | None = None
        if stop_id is not None:
            finish = "stop"
        elif len(seq.output) >= seq.sampling.max_tokens:
            finish = "length"
        return Emission(
            request_id=seq.request_id,
            token_ids=(token,),
            index=index,
            finish_reason=finish,
            stop_token_id=stop_id,
            prompt_tokens=len(seq.prompt) if index == 0 else 0,
        )

    def _next_token(self, seq: EngineRequest) -> tuple[int, int | None]:
        """The next corpus token, or EOS at the corpus end; a stop id also returns itself."""
        sampling = seq.sampling
        may_stop = len(seq.output) >= sampling.min_tokens
        for _ in range(2 * len(self._corpus) + 1):
            if seq.cursor >= len(self._corpus):
                if may_stop and not sampling.ignore_eos and seq.eos_token_id is not None:
                    return seq.eos_token_id, seq.eos_token_id
                seq.cursor = 0  # wrap around: ignore_eos, min_tokens, or no EOS known
            token = self._corpus[seq.cursor]
            seq.cursor += 1
            if token not in sampling.stop_token_ids:
                return token, None
            if may_stop:
                return token, token
            # min_tokens not reached: the stop id is suppressed, as vLLM masks its logit
        return self._corpus[0], None  # the corpus is nothing but stop ids: give up on skipping

    def _free(self, request_id: str) -> None:
        seq = self._by_id.pop(request_id, None)
        if seq is not None and seq in self._running:
            self._running.remove(seq)
