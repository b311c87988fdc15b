"""Plain records only the simulated engine uses: its scheduler/cache config and a step's result."""

from __future__ import annotations

from dataclasses import dataclass

from services.mocker.transfer import DEFAULT_KV_BYTES_PER_TOKEN
from shared.worker.records import Emission


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
    dp_rank: int = 0
    """The data-parallel rank this engine is (its KV events say so)."""
    kv_block_bytes: int = DEFAULT_KV_BYTES_PER_TOKEN * 16
    """Bytes of one KV block (``services.mocker.transfer``): what a decode pulls per block."""
    kv_transfer_bandwidth_gbps: float = 25.0
    """KV pull bandwidth, GB/s (10^9 bytes per second)."""
    kv_transfer_latency_ms: float = 1.0
    """Fixed time of a pull of at least one block."""
    kv_pin_timeout_s: float = 30.0
    """A prefill's pinned blocks are freed this long after it finished if nobody released them
    (wall time, not divided by the speedup ratio: routers read ``KvTransfer.expires_at``)."""

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class StepOutput:
    """The result of one ``step()``: emissions in running order and the simulated duration."""

    emissions: list[Emission]
    duration_s: float
    prefill_tokens: int
    decode_seqs: int
    prefill_s: float = 0.0
    """The part of ``duration_s`` spent on prompt tokens; the decode part comes after it."""
    pulled: tuple[tuple[str, int], ...] = ()
    """Disaggregated decode: ``(request id, blocks pulled)`` of the pulls that landed at the
    start of the step (their requests were queued before it scheduled)."""
