"""Load the causal LM the engine runs: real weights from a local directory, or random weights
built from its ``config.json``. Nothing is ever fetched from a model hub.

torch and transformers are imported inside the functions that need them (``load_model``, with
``importlib``: their types stay ``Any`` whether or not they are installed), so the pure helpers
(``resolve_device``, ``cb_sizes``) and the package import without them. ``HF_HUB_OFFLINE=1`` and
``TRANSFORMERS_OFFLINE=1`` are set (unless already set) before transformers is first imported.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CPU_KV_BLOCKS",
    "CPU_MAX_BATCH_TOKENS",
    "DTYPES",
    "LoadedModel",
    "cb_sizes",
    "load_model",
    "resolve_device",
    "resolve_dtype",
]

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Also ``services.hf_worker.config.DTYPES`` (kept apart: the config imports no engine module)."""
CPU_KV_BLOCKS = 256
"""KV blocks when ``--num-blocks 0`` on a CPU (transformers sizes the cache from free GPU memory,
which a CPU does not report without psutil)."""
CPU_MAX_BATCH_TOKENS = 512


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """The model (a transformers ``PreTrainedModel``) and what the engine reads off it."""

    model: Any
    device: str
    dtype: str
    vocab_size: int
    context_length: int


def resolve_device(device: str, cuda_available: bool) -> str:
    """``auto`` → ``cuda`` when a GPU is there, else ``cpu``; ``cuda`` without one is an error."""
    if device == "auto":
        return "cuda" if cuda_available else "cpu"
    if device == "cuda" and not cuda_available:
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    return device


def resolve_dtype(dtype: str, device: str, config_dtype: str | None) -> str:
    """``auto`` → the config's dtype on a GPU, float32 on a CPU (bf16 matmuls are slow there)."""
    if dtype != "auto":
        return dtype
    if device == "cpu":
        return "float32"
    return config_dtype if config_dtype in ("bfloat16", "float16", "float32") else "bfloat16"


def cb_sizes(device: str, num_blocks: int, max_batch_tokens: int) -> tuple[int | None, int | None]:
    """``(num_blocks, max_batch_tokens)`` for the manager; None lets transformers size it from
    GPU memory (0 on the command line), which on a CPU becomes the fixed defaults above."""
    if device == "cpu":
        return num_blocks or CPU_KV_BLOCKS, max_batch_tokens or CPU_MAX_BATCH_TOKENS
    return num_blocks or None, max_batch_tokens or None


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def load_model(
    model_dir: Path, *, random_weights: bool, device: str, dtype: str, seed: int
) -> LoadedModel:
    """The model of ``model_dir`` on ``device`` in eval mode (blocking: run it in a thread)."""
    _offline()
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    AutoConfig, AutoModelForCausalLM = transformers.AutoConfig, transformers.AutoModelForCausalLM

    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json")
    resolved = resolve_device(device, torch.cuda.is_available())
    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    config_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = resolve_dtype(dtype, resolved, str(config_dtype).removeprefix("torch.") or None)
    torch_dtype = getattr(torch, name)
    if random_weights:
        torch.manual_seed(seed)
        with torch.device(resolved):  # initialise on the device: no CPU copy of a big model
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=torch_dtype, local_files_only=True
        )
    model = model.to(resolved).eval()
    text = config.get_text_config()
    return LoadedModel(
        model=model,
        device=resolved,
        dtype=name,
        vocab_size=int(text.vocab_size),
        context_length=int(getattr(text, "max_position_embeddings", 0) or 0),
    )
