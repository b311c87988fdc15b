"""Plain records the simulated engine takes and returns (config, emissions, load, stats)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.messages import FinishReason, TokenLogprob


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Scheduler limits and the simulated GPU's KV capacity."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_gpu_blocks: int = 16384
    enable_prefix_caching: bool = True
    seed: int = 0
    speedup_ratio: float = 1.0
    first_token_decodes: bool = False
    """Dynamo's mocker: a step in which a prefill completes also pays the decode time (its first
    token comes from the decode phase); off = a first token is sampled with its prefill."""
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
    choice: int = 0
    """Which of the request's ``n`` sequences produced it (``index`` counts per choice)."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """With ``SamplingParams.logprobs``: one per id of ``token_ids``."""
    done: bool = False
    """The request's last emission: every choice has finished (or it was cancelled)."""


@dataclass(frozen=True, slots=True)
class StepOutput:
    """The result of one ``step()``: emissions in running order and the simulated duration."""

    emissions: list[Emission]
    duration_s: float
    prefill_tokens: int
    decode_seqs: int
    prefill_s: float = 0.0
    """The part of ``duration_s`` spent on prompt tokens; the decode part comes after it."""


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a router needs to know about this worker's load."""

    active: int
    waiting: int
    kv_used_blocks: int
    kv_total_blocks: int
    prefill_tokens: int
    """Prompt tokens still to compute across waiting and prefilling requests."""


@dataclass(slots=True)
class EngineStats:
    """Cumulative counters (for metrics)."""

    prompt_tokens: int = 0
    cache_hit_tokens: int = 0
    preemptions: int = 0


class EngineError(ValueError):
    """A request the engine can never run (empty prompt, larger than the KV cache, ...)."""
