"""Mocker configuration: its settings table (``JETSERVE_MOCKER_*``)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from services.mocker.parsers import AUTO, NONE, REASONING_PARSERS, TOOL_PARSERS, resolve_parsers
from shared.config import CommonConfig, setting
from shared.kv_stream import DEFAULT_MAX_AGE_S, DEFAULT_MAX_BYTES
from shared.model_dir import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model_dir
from shared.registry import DEFAULT_WORKER_TTL_S
from shared.subjects import check_token

__all__ = ["MockerConfig", "default_model_dir"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MockerConfig(CommonConfig):
    """One mocker process: ``num_workers`` simulated GPUs serving one model."""

    SERVICE = "mocker"
    DESCRIPTION = "A simulated GPU worker."

    model_path: Path | None = setting(
        None, "Local model directory (unset = the bundled Qwen3 tokenizer in the user cache)"
    )
    model_name: str = setting(DEFAULT_MODEL_NAME, "Served model name")
    worker_id: str = setting(
        "",
        "Worker id (empty = random); with --num-workers > 1 each worker gets <id>-<n>",
        per_instance=True,
    )
    num_workers: int = setting(1, "Workers hosted in this process, each with its own id", ge=1)
    seed: int = setting(0, "Seed for deterministic output")
    speedup_ratio: float = setting(
        1.0, "Divide every simulated time by this (0 = never sleep)", ge=0
    )
    max_num_seqs: int = setting(256, "Most requests running at once per worker", ge=1)
    max_waiting: int = setting(
        1024,
        "Most requests queued (not yet running) per worker; more get a retryable 503 "
        "(worker_busy) that the formatter routes elsewhere. 0 = no bound",
        ge=0,
    )
    max_num_batched_tokens: int = setting(8192, "Token budget per engine step", ge=1)
    block_size: int = setting(16, "KV block size in tokens", ge=1)
    num_gpu_blocks_override: int = setting(16384, "Simulated KV cache size in blocks", ge=1)
    enable_prefix_caching: bool = setting(
        True, "Reuse full KV blocks across requests by hash (and publish KV events)"
    )
    dynamo_step_timing: bool = setting(
        False,
        "Time steps as Dynamo's mocker: prefill time, then the step's tokens go out, then the "
        "decode time, which a step that completes a prefill pays too. Off: one prefill + "
        "decode time, tokens at its end, and a first token comes with its prefill",
    )
    kv_stream_max_age_s: float = setting(
        DEFAULT_MAX_AGE_S,
        "KV-events stream retention by age (the stream is created or updated to it)",
        gt=0,
    )
    kv_stream_max_bytes: int = setting(
        DEFAULT_MAX_BYTES, "KV-events stream retention by size", ge=1
    )
    worker_ttl_s: float = setting(
        DEFAULT_WORKER_TTL_S,
        "Worker card TTL; heartbeat every TTL/3",
        gt=0,
        aliases=("JETSERVE_WORKER_TTL_S",),
    )
    context_length: int = setting(0, "Context length override (0 = the model's own)", ge=0)
    tool_call_parser: str = setting(
        AUTO,
        "The model's tool-call syntax, put on its card for the formatter's parser and written "
        "by the mocker (auto = guessed from the model name, none = no tool calls)",
        choices=(AUTO, NONE, *TOOL_PARSERS),
    )
    reasoning_parser: str = setting(
        AUTO,
        "The model's reasoning syntax, put on its card (auto = guessed from the model name, "
        "none = the model does not reason)",
        choices=(AUTO, NONE, *REASONING_PARSERS),
    )

    def __post_init__(self) -> None:
        CommonConfig.__post_init__(self)
        if self.worker_id:
            check_token(self.worker_id, "--worker-id / JETSERVE_MOCKER_WORKER_ID")

    def worker_ids(self) -> list[str]:
        """The ids of the workers this process hosts."""
        base = self.worker_id or f"mocker-{secrets.token_hex(4)}"
        if self.num_workers == 1:
            return [base]
        return [f"{base}-{i}" for i in range(self.num_workers)]

    def parsers(self) -> tuple[str, str]:
        """``(tool parser, reasoning parser)`` for the card (empty: none)."""
        return resolve_parsers(self.model_name, self.tool_call_parser, self.reasoning_parser)

    def resolved_model_dir(self) -> Path:
        """The model directory, writing the bundled default on first use."""
        if self.model_path is not None:
            return self.model_path
        return ensure_default_model_dir(default_model_dir())
