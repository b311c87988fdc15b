"""Plain records every engine takes and returns: the request it runs, what it emits, its load,
its counters and the facts a worker card is made of."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from shared.messages import FinishReason, ImageInput, SamplingParams, TokenLogprob

EnginePhase = Literal["both", "prefill", "decode"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInput:
    """One admitted request, as the runtime hands it to an engine (``Generate`` checked)."""

    request_id: str
    token_ids: tuple[int, ...]
    sampling: SamplingParams
    hash_seed: int
    """``shared.hashing.salted_seed`` of the request's LoRA and ``cache_salt``: the seed of its
    blocks' local hashes."""
    lora_name: str | None = None
    resumed_tokens: int = 0
    """After a migration: how many trailing ``token_ids`` an earlier worker generated."""
    dp_rank: int = 0
    """The data-parallel rank that runs it (``Generate.dp_rank``; 0 without data parallelism)."""
    phase: EnginePhase = "both"
    """``prefill``: compute the prompt's KV and one token, then keep the blocks pinned for a
    decode worker and say how to pull them (``Emission.kv_transfer_params`` on the last
    emission). ``decode``: pull the blocks ``kv_transfer_params`` names (those not already held)
    before decoding. ``both``: aggregated."""
    kv_transfer_params: dict[str, Any] | None = None
    """Decode phase: the prefill engine's ``kv_transfer_params`` (``KvTransfer.params``)."""
    images: tuple[ImageInput, ...] = ()
    """The prompt's images (``Generate.images``): their hashes go into the hashes of the blocks
    holding their placeholder tokens; engines that need pixels read ``data``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFacts:
    """What a worker card says about its engine (read from the engine once it has started)."""

    kind: str
    """``mocker``, ``vllm``, ``vllm-remote``, ``hf``."""
    block_size: int
    kv_blocks: int
    max_num_seqs: int
    context_length: int
    kv_events: bool = True
    """False: the engine publishes no KV events (routers should use approximate mode)."""
    kv_pin_timeout_s: float = 0.0
    """Disaggregated prefill: how long the engine keeps a prefill's blocks pinned for the
    decode worker when nobody releases them (``KvTransfer.expires_at`` = now + this; 0: the
    engine names no timeout, and ``expires_at`` stays 0 = unknown)."""


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
    kv_transfer_params: dict[str, Any] | None = None
    """Prefill phase, on the last emission: how a decode engine pulls the pinned blocks."""


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
