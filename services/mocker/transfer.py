"""The simulated KV transfer of disaggregated serving: how big a block is, how long a pull
takes, and the handle (``kv_transfer_params``) a prefill hands its decode worker. Pure.

A pull of ``blocks`` blocks takes ``blocks * block_bytes / bandwidth + latency``, divided by
the speedup ratio (0: no time at all, as every simulated time). The bandwidth is in GB/s
(gigabytes, 10^9 bytes, per second; the default 25 GB/s is one 200 Gb/s RDMA link, NIXL's
usual path between two nodes). A pull of nothing (the decode worker held every block) takes no
time. A block holds ``2 (K and V) * layers * KV heads * head dim * dtype bytes`` per token
(``kv_bytes_per_token``, from the model's ``config.json``), times the block size.

The mocker's handle names the prompt's full blocks by sequence hash, the hashes its
``BlockStored`` events carry::

    {"engine": "mocker", "block_hashes": [h0, h1, ...], "num_blocks": n,
     "block_size": 16, "block_bytes": 1835008, "dp_rank": 0}

A decode engine matches them against its own hashes of the same prompt (same salt, same chain)
and pulls those of the leading run it does not hold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_KV_BYTES_PER_TOKEN = 2 * 28 * 8 * 128 * 2
"""Qwen3-0.6B in bf16 (28 layers, 8 KV heads of 128): 114,688 bytes of KV per token, used when
the model directory has no (usable) ``config.json``."""
_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
}
MOCKER_ENGINE = "mocker"


def kv_bytes_per_token(config: Mapping[str, Any]) -> int | None:
    """KV bytes per token of a Hugging Face ``config.json`` (None: not enough in it)."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" not in config:
        config = text
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config.get("num_attention_heads") or 0)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or (int(config["hidden_size"]) // heads))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    size = 2 * layers * kv_heads * head_dim * _DTYPE_BYTES.get(dtype, 2)
    return size if size > 0 else None


def read_kv_bytes_per_token(model_dir: Path) -> int:
    """``kv_bytes_per_token`` of ``model_dir/config.json``, else ``DEFAULT_KV_BYTES_PER_TOKEN``."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return DEFAULT_KV_BYTES_PER_TOKEN
    size = kv_bytes_per_token(config) if isinstance(config, dict) else None
    return size or DEFAULT_KV_BYTES_PER_TOKEN


def pull_seconds(
    blocks: int,
    *,
    block_bytes: int,
    bandwidth_gbps: float,
    latency_ms: float,
    speedup_ratio: float,
) -> float:
    """Wall time of pulling ``blocks`` blocks (GB/s = 10^9 bytes/s; 0 blocks or speedup 0: 0)."""
    if blocks <= 0 or speedup_ratio <= 0:
        return 0.0
    transfer_s = blocks * block_bytes / (bandwidth_gbps * 1e9) if bandwidth_gbps > 0 else 0.0
    return (transfer_s + latency_ms / 1000.0) / speedup_ratio


def handle(
    block_hashes: Sequence[int], *, block_size: int, block_bytes: int, dp_rank: int
) -> dict[str, Any]:
    """A prefill's ``kv_transfer_params``: its pinned blocks (see the module docstring)."""
    return {
        "engine": MOCKER_ENGINE,
        "block_hashes": list(block_hashes),
        "num_blocks": len(block_hashes),
        "block_size": block_size,
        "block_bytes": block_bytes,
        "dp_rank": dp_rank,
    }


def named_blocks(params: Mapping[str, Any] | None, own_hashes: Sequence[int]) -> int:
    """How many leading blocks of a prompt (``own_hashes``) the handle ``params`` names: the
    leading run where its hashes equal the decode side's own (0 for another engine's handle)."""
    if not params or params.get("engine") != MOCKER_ENGINE:
        return 0
    named = params.get("block_hashes")
    if not isinstance(named, list):
        return 0
    count = 0
    for theirs, ours in zip(named, own_hashes, strict=False):
        if theirs != ours:
            break
        count += 1
    return count
