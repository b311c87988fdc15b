"""Mocker configuration: its settings table (``JETSERVE_MOCKER_*``): the worker's settings
(``shared.worker.config``) plus the simulated engine's."""

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
