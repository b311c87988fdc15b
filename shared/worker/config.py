"""Settings every worker has, whatever its engine: ``WorkerConfig``, the base of each engine's
settings table (``MockerConfig``, ``VllmWorkerConfig``, ``HfWorkerConfig``)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from shared.config import CommonConfig, setting
from shared.kv_stream import DEFAULT_MAX_AGE_S, DEFAULT_MAX_BYTES
from shared.lora import LoraModule, parse_lora_modules
from shared.messages import WORKER_ROLES
from shared.model_dir import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model_dir
from shared.registry import DEFAULT_WORKER_TTL_S
from shared.subjects import check_token
from shared.worker.health import DEFAULT_PAYLOAD, check_payload
from shared.worker.parsers import AUTO, NONE, REASONING_PARSERS, TOOL_PARSERS, resolve_parsers

__all__ = ["WorkerConfig", "default_model_dir"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig(CommonConfig):
    """One worker process: ``num_workers`` engines serving one model."""

    SERVICE = "worker"
    DESCRIPTION = "A worker."
    ID_PREFIX: ClassVar[str] = "worker"
    """Random worker ids start with this (``mocker-1a2b3c4d``)."""

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
    max_waiting: int = setting(
        1024,
        "Most requests queued (not yet running) per worker; more get a retryable 503 "
        "(worker_busy) that the formatter routes elsewhere. 0 = no bound",
        ge=0,
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
    role: str = setting(
        "both",
        "Disaggregated serving: prefill (computes prompts' KV for decode workers), decode, or "
        "both (aggregated)",
        choices=WORKER_ROLES,
    )
    data_parallel_size: int = setting(
        1, "Data-parallel ranks per worker: each is a routing target with its own KV cache", ge=1
    )
    tool_call_parser: str = setting(
        AUTO,
        "The model's tool-call syntax, put on its card for the formatter's parser (auto = "
        "guessed from the model name, none = no tool calls)",
        choices=(AUTO, NONE, *TOOL_PARSERS),
    )
    reasoning_parser: str = setting(
        AUTO,
        "The model's reasoning syntax, put on its card (auto = guessed from the model name, "
        "none = the model does not reason)",
        choices=(AUTO, NONE, *REASONING_PARSERS),
    )
    lora_modules: str = setting(
        "",
        "LoRA adapters to hold from the start, vLLM's syntax: name=path or a JSON object "
        '{"name": ..., "path": ..., "base_model_name": ...}, several after one flag '
        "(the env var: separated by spaces, commas or newlines)",
        many=True,
    )
    max_loras: int = setting(
        1,
        "LoRA adapters the engine keeps loaded at once (vLLM's --max-loras); the others it "
        "holds are swapped in on demand, the least recently used out",
        ge=1,
    )
    health_check_idle_s: float = setting(
        10.0,
        "Engine health canary (Dynamo's DYN_CANARY_WAIT_TIME): after this many seconds with "
        "nothing to do, the worker runs --health-check-payload through its engine (0 = no "
        "canary)",
        ge=0,
    )
    health_check_timeout_s: float = setting(
        3.0,
        "A canary not finished within this many seconds marks the engine unhealthy: the worker "
        "leaves the registry and stops answering probes, so its requests migrate (Dynamo's "
        "DYN_HEALTH_CHECK_REQUEST_TIMEOUT)",
        gt=0,
    )
    health_check_payload: str = setting(
        DEFAULT_PAYLOAD,
        'The canary\'s request as JSON: {"token_ids": [...], "sampling": {SamplingParams}} '
        "(Dynamo's DYN_HEALTH_CHECK_PAYLOAD)",
        parse=check_payload,
    )
    engine_stall_s: float = setting(
        30.0,
        "Progress watchdog: an engine with requests that hands over no output and takes no "
        "step for this many seconds is unhealthy, as for a missed canary. Keep it above the "
        "longest prefill step (0 = no watchdog)",
        ge=0,
    )

    def __post_init__(self) -> None:
        CommonConfig.__post_init__(self)
        if self.worker_id:
            check_token(self.worker_id, f"--worker-id / JETSERVE_{self.SERVICE.upper()}_WORKER_ID")
        self.adapters()  # a bad --lora-modules stops the worker at start, naming the item

    def adapters(self) -> tuple[LoraModule, ...]:
        """The ``--lora-modules`` adapters, parsed (``ValueError`` naming a bad item)."""
        return parse_lora_modules(self.lora_modules)

    def worker_ids(self) -> list[str]:
        """The ids of the workers this process hosts."""
        base = self.worker_id or f"{self.ID_PREFIX}-{secrets.token_hex(4)}"
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
