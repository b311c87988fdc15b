"""Mock embedding worker configuration: its settings table (``JETSERVE_EMBEDDER_*``)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from services.embedder.model import (
    DEFAULT_EMBEDDING_MODEL,
    default_embedding_model_dir,
    ensure_embedding_model_dir,
)
from shared.config import CommonConfig, computed_setting, setting
from shared.registry import DEFAULT_WORKER_TTL_S
from shared.subjects import check_token


def _random_id() -> str:
    return f"embedder-{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbedderConfig(CommonConfig):
    """One mock embedding worker serving one model."""

    SERVICE = "embedder"
    DESCRIPTION = "A mock embedding worker: deterministic, normalized vectors (/v1/embeddings)."

    model_path: Path | None = setting(
        None,
        "Local model directory (unset = the bundled Qwen3 tokenizer with Qwen3-Embedding-0.6B's "
        "config, in the user cache)",
    )
    model_name: str = setting(DEFAULT_EMBEDDING_MODEL, "Served model name")
    worker_id: str = computed_setting(
        _random_id,
        "Worker id, the subject token of its requests (empty = random)",
        default_doc="random",
        per_instance=True,
    )
    embedding_size: int = setting(
        0, "Floats per vector (0 = the model's hidden_size from config.json)", ge=0
    )
    context_length: int = setting(0, "Context length override (0 = the model's own)", ge=0)
    worker_ttl_s: float = setting(
        DEFAULT_WORKER_TTL_S,
        "Worker card TTL; heartbeat every TTL/3",
        gt=0,
        aliases=("JETSERVE_WORKER_TTL_S",),
    )

    def __post_init__(self) -> None:
        # Not super(): slotted dataclasses are rebuilt, which breaks zero-argument super().
        CommonConfig.__post_init__(self)
        check_token(self.worker_id, "--worker-id / JETSERVE_EMBEDDER_WORKER_ID")

    def resolved_model_dir(self) -> Path:
        """The model directory, writing the bundled default on first use."""
        if self.model_path is not None:
            return self.model_path
        return ensure_embedding_model_dir(default_embedding_model_dir())
