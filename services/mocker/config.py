"""Mocker configuration: its settings table (``JETSERVE_MOCKER_*``): the worker's settings
(``shared.worker.config``; ``--role`` and ``--data-parallel-size`` among them) plus the
simulated engine's, its KV transfer's for disaggregated serving included."""

from __future__ import annotations

from dataclasses import dataclass

from shared.config import setting
from shared.worker.config import WorkerConfig, default_model_dir

__all__ = ["MockerConfig", "default_model_dir"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MockerConfig(WorkerConfig):
    """One mocker process: ``num_workers`` simulated GPUs serving one model."""

    SERVICE = "mocker"
    DESCRIPTION = "A simulated GPU worker."
    ID_PREFIX = "mocker"

    seed: int = setting(0, "Seed for deterministic output")
    speedup_ratio: float = setting(
        1.0, "Divide every simulated time by this (0 = never sleep)", ge=0
    )
    max_num_seqs: int = setting(256, "Most requests running at once per worker", ge=1)
    max_num_batched_tokens: int = setting(8192, "Token budget per engine step", ge=1)
    block_size: int = setting(16, "KV block size in tokens", ge=1)
    num_gpu_blocks_override: int = setting(16384, "Simulated KV cache size in blocks", ge=1)
    enable_prefix_caching: bool = setting(
        True, "Reuse full KV blocks across requests by hash (and publish KV events)"
    )
    dynamo_step_timing: bool = setting(
        False,
        "Time steps as Dynamo's mocker: prefill time, then the step's tokens go out, then the "
        "decode time, which a step that completes a prefill pays too. Off: one prefill + "
        "decode time, tokens at its end, and a first token comes with its prefill",
    )
    kv_transfer_bandwidth_gbps: float = setting(
        25.0,
        "Disaggregated decode: KV pull bandwidth in GB/s (gigabytes, 10^9 bytes, per second; "
        "25 = one 200 Gb/s RDMA link); pull times are divided by --speedup-ratio as all times",
        gt=0,
    )
    kv_transfer_latency_ms: float = setting(
        1.0,
        "Disaggregated decode: fixed time of a KV pull, in ms, on top of blocks x bytes per "
        "block / bandwidth (a pull of no block takes no time)",
        ge=0,
    )
    kv_block_bytes: int = setting(
        0,
        "Bytes per KV block a decode worker pulls (0 = 2 x layers x KV heads x head dim x "
        "dtype bytes x block size from the model's config.json; Qwen3-0.6B's without one)",
        ge=0,
    )
    hang_after_tokens: int | None = setting(
        None,
        "Test/debug only: the simulated engine stops stepping once it has emitted this many "
        "tokens (canaries included) while the process and its runtime go on, to exercise "
        "the engine health checks (unset = never)",
        ge=0,
    )
    hang_for_s: float = setting(
        0.0,
        "Test/debug only, with --hang-after-tokens: resume after this many seconds (0 = stay "
        "hung until the process stops)",
        ge=0,
    )
    kv_pin_timeout_s: float = setting(
        30.0,
        "Prefill worker: free a prefill's pinned KV blocks after this many seconds (wall "
        "time) when no decode worker released them",
        gt=0,
    )
    lora_load_time_s: float = setting(
        0.2,
        "Simulated time to load a LoRA adapter into one of the engine's --max-loras slots "
        "(divided by --speedup-ratio; 0 = instant)",
        ge=0,
    )
