"""Fixtures of the engine tests: a tiny random-weight Qwen3 model directory (2 layers, hidden 64)
with the real Qwen3 tokenizer files, so the whole stack can serve it.

``make test-engines`` installs ``.[hf]`` (torch, transformers) first; in a plain ``make test``
without them, the modules that need torch are skipped at import (``pytest.importorskip``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.model_dir import ensure_default_model_dir

TINY_QWEN3: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 151936,
    "max_position_embeddings": 2048,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
"""Qwen3-0.6B's shape, shrunk; the vocabulary stays the tokenizer's (151,936 embedding rows)."""


def write_tiny_model(target: Path) -> Path:
    """The Qwen3 tokenizer files and generation config (``ensure_default_model_dir``) with the
    tiny ``config.json`` over the 0.6B one."""
    ensure_default_model_dir(target)
    written = json.loads((target / "config.json").read_text(encoding="utf-8"))
    config = {
        **TINY_QWEN3,
        "bos_token_id": written["bos_token_id"],
        "eos_token_id": written["eos_token_id"],
    }
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return target


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"))
