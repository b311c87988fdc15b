"""transformers worker configuration: its settings table (``JETSERVE_HF_WORKER_*``): the worker's
settings (``shared.worker.config``) plus the engine's (model loading, device, paged cache)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from shared.config import setting
from shared.worker.config import WorkerConfig

__all__ = ["DEVICES", "DTYPES", "HfWorkerConfig"]

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True, kw_only=True)
class HfWorkerConfig(WorkerConfig):
    """One transformers worker process: ``num_workers`` engines, each with its own model copy."""

    SERVICE = "hf_worker"
    DESCRIPTION = "A worker running a transformers model with continuous batching."
    ID_PREFIX: ClassVar[str] = "hf"

    random_weights: bool = setting(
        False,
        "Build the model from the directory's config.json with random (seeded) weights instead "
        "of loading its safetensors",
    )
    device: str = setting(
        "auto", "Where the model runs (auto = cuda if available)", choices=DEVICES
    )
    dtype: str = setting(
        "auto", "Weights dtype (auto = the config's on a GPU, float32 on a CPU)", choices=DTYPES
    )
    seed: int = setting(0, "Seed of random weights and of sampling")
    block_size: int = setting(64, "KV cache page size in tokens", ge=4)
    num_blocks: int = setting(
        0, "KV cache size in blocks (0 = sized from free GPU memory; 256 on a CPU)", ge=0
    )
    max_batch_tokens: int = setting(
        0, "Tokens per forward pass (0 = transformers decides; 512 on a CPU)", ge=0
    )
    max_num_seqs: int = setting(64, "Most requests in one forward pass per worker", ge=1)
    prefix_sharing: bool = setting(True, "Share KV blocks of common prefixes inside the engine")

    def model_dir(self) -> Path:
        """The model directory (the bundled weightless Qwen3 one needs --random-weights)."""
        return self.resolved_model_dir()
