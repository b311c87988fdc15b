"""``HfEngineOptions``: what one transformers engine needs, on both sides of the process boundary
(the worker's ``HfEngine`` and the engine process's ``EngineCore``). Plain data: it crosses the
boundary as JSON (``core_wire.encode_options``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["HfEngineOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HfEngineOptions:
    """What one engine needs (``HfWorkerConfig`` makes one per worker)."""

    model_dir: Path
    random_weights: bool = False
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 64
    """The paged cache's page size in tokens (transformers' ``page_size``/``block_size``)."""
    num_blocks: int = 0
    """KV blocks (0: transformers sizes the cache from free GPU memory)."""
    max_batch_tokens: int = 0
    """Tokens per forward pass (0: transformers decides)."""
    max_num_seqs: int = 64
    """Requests per forward pass (``max_requests_per_batch``)."""
    context_length: int = 0
    """0: the model's ``max_position_embeddings``."""
    seed: int = 0
    """Random weights and the manager's sampling generator."""
    prefix_sharing: bool = True
    """transformers' block sharing (prefix caching) inside the engine."""
    log_level: str = "INFO"
    log_format: str = "auto"
    """The engine process's logging (the worker's ``--log-level`` and ``--log-format``)."""
    own_process: bool = True
    """Run the model and its manager in a process of their own (``core_process``), so the
    worker's event loop never waits on their GIL. False: in threads of this process (the
    GPU benchmark's "engine alone" baseline, and tests that need no second process)."""
