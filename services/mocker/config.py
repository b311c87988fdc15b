"""Mocker configuration: CLI flags, each falling back to a ``JETSERVE_MOCKER_*`` env var."""

from __future__ import annotations

import argparse
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from shared.config import CommonConfig, add_common_options, env, env_help
from shared.kv_stream import DEFAULT_MAX_AGE_S, DEFAULT_MAX_BYTES
from shared.model_dir import DEFAULT_MODEL_NAME, ensure_default_model_dir
from shared.registry import DEFAULT_WORKER_TTL_S
from shared.subjects import check_token

_P = "JETSERVE_MOCKER_"
_T = TypeVar("_T", str, int, float)


def default_model_dir() -> Path:
    """``<user cache dir>/jetserve/qwen3-model`` (XDG), where the bundled Qwen3 files go."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jetserve" / "qwen3-model"


@dataclass(frozen=True, slots=True, kw_only=True)
class MockerConfig(CommonConfig):
    """One mocker process: ``num_workers`` simulated GPUs serving one model."""

    model_path: Path | None = None
    """Local model directory; ``None`` = the bundled Qwen3 tokenizer in the user cache."""
    model_name: str = DEFAULT_MODEL_NAME
    worker_id: str = ""
    """Empty = a random id. With ``num_workers > 1`` each worker gets ``<id>-<n>``."""
    num_workers: int = 1
    seed: int = 0
    speedup_ratio: float = 1.0
    """Divide every simulated time by this; 0 = never sleep."""
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_gpu_blocks_override: int = 16384
    enable_prefix_caching: bool = True
    """Reuse full KV blocks across requests by hash (and publish KV events)."""
    dynamo_step_timing: bool = False
    """Time steps as Dynamo's mocker: prefill time, then the step's tokens go out, then the
    decode time, which a step that completes a prefill pays too (the first token comes from
    the decode phase). Off: one prefill + decode time, tokens at its end, and a first token
    comes with its prefill (no decode time of its own)."""
    kv_stream_max_age_s: float = DEFAULT_MAX_AGE_S
    """Retention of the KV-events stream by age (the stream is created or updated to it)."""
    kv_stream_max_bytes: int = DEFAULT_MAX_BYTES
    """Retention of the KV-events stream by size."""
    worker_ttl_s: float = DEFAULT_WORKER_TTL_S
    context_length: int = 0
    """0 = the model's own (``config.json``)."""
    shutdown_grace_s: float = 10.0
    """On SIGTERM, how long in-flight requests may run before they end ``cancelled``."""

    def __post_init__(self) -> None:
        CommonConfig.__post_init__(self)
        if self.worker_id:
            check_token(self.worker_id, "--worker-id / JETSERVE_MOCKER_WORKER_ID")
        for name in ("num_workers", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.num_gpu_blocks_override < 1:
            raise ValueError("--num-gpu-blocks-override must be at least 1")
        if self.speedup_ratio < 0:
            raise ValueError("--speedup-ratio must be >= 0 (0 = no sleeping)")
        if self.kv_stream_max_age_s <= 0 or self.kv_stream_max_bytes < 1:
            raise ValueError("--kv-stream-max-age-s and --kv-stream-max-bytes must be > 0")
        if self.worker_ttl_s <= 0:
            raise ValueError("--worker-ttl-s must be > 0")

    def worker_ids(self) -> list[str]:
        """The ids of the workers this process hosts."""
        base = self.worker_id or f"mocker-{secrets.token_hex(4)}"
        if self.num_workers == 1:
            return [base]
        return [f"{base}-{i}" for i in range(self.num_workers)]

    def resolved_model_dir(self) -> Path:
        """The model directory, writing the bundled default on first use."""
        if self.model_path is not None:
            return self.model_path
        return ensure_default_model_dir(default_model_dir())

    @classmethod
    def from_cli(cls, argv: list[str] | None = None) -> MockerConfig:
        parser = argparse.ArgumentParser(
            prog="python -m services.mocker", description="A simulated GPU worker."
        )
        add_common_options(parser, service="mocker")

        def opt(flag: str, default: _T, text: str) -> None:
            var = _P + flag.removeprefix("--").replace("-", "_").upper()
            parser.add_argument(
                flag, type=type(default), default=env(var, default), help=env_help(text, var)
            )

        ttl_default = env("JETSERVE_WORKER_TTL_S", DEFAULT_WORKER_TTL_S)

        opt("--model-path", "", "Local model directory (empty = bundled Qwen3 in the cache)")
        opt("--model-name", DEFAULT_MODEL_NAME, "Served model name")
        opt("--worker-id", "", "Worker id (empty = random)")
        opt("--num-workers", 1, "Workers hosted in this process, each with its own id")
        opt("--seed", 0, "Seed for deterministic output")
        opt("--speedup-ratio", 1.0, "Divide simulated times by this (0 = never sleep)")
        opt("--max-num-seqs", 256, "Most requests running at once per worker")
        opt("--max-num-batched-tokens", 8192, "Token budget per engine step")
        opt("--block-size", 16, "KV block size in tokens")
        opt("--num-gpu-blocks-override", 16384, "Simulated KV cache size in blocks")
        var = _P + "ENABLE_PREFIX_CACHING"
        parser.add_argument(
            "--enable-prefix-caching",
            action=argparse.BooleanOptionalAction,
            default=env(var, True),
            help=env_help("Reuse cached KV blocks across requests (prefix caching)", var),
        )
        var = _P + "DYNAMO_STEP_TIMING"
        parser.add_argument(
            "--dynamo-step-timing",
            action=argparse.BooleanOptionalAction,
            default=env(var, False),
            help=env_help(
                "Time steps as Dynamo's mocker: prefill, send the step's tokens, then decode "
                "(first tokens included); --no-dynamo-step-timing sends them at the step's end",
                var,
            ),
        )
        opt("--kv-stream-max-age-s", DEFAULT_MAX_AGE_S, "KV-events stream retention (seconds)")
        opt("--kv-stream-max-bytes", DEFAULT_MAX_BYTES, "KV-events stream retention (bytes)")
        opt(
            "--worker-ttl-s",
            ttl_default,
            "Worker card TTL, heartbeat every TTL/3 (falls back to JETSERVE_WORKER_TTL_S)",
        )
        opt("--context-length", 0, "Context length override (0 = from the model)")
        opt("--shutdown-grace-s", 10.0, "On SIGTERM, time to finish in-flight requests")
        args = vars(parser.parse_args(argv))
        model_path = args.pop("model_path")
        try:
            return cls(model_path=Path(model_path) if model_path else None, **args)
        except ValueError as exc:
            parser.error(str(exc))
