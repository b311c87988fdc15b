"""vLLM worker configuration: its settings table (``JETSERVE_VLLM_WORKER_*``).

Two modes: in-process (``--engine-url`` empty: each worker loads ``AsyncLLM`` with KV events
on a local ZMQ socket) and remote (``--engine-url``: each worker fronts one running
``vllm serve``; with several workers, one comma-separated URL, KV events endpoint and replay
endpoint per worker, in the same order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shared.config import SettingError, setting
from shared.worker.config import WorkerConfig

__all__ = ["VllmWorkerConfig"]


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmWorkerConfig(WorkerConfig):
    """One vLLM worker process: ``num_workers`` vLLM engines (in-process or remote)."""

    SERVICE = "vllm_worker"
    DESCRIPTION = "A worker running vLLM, in this process or behind `vllm serve`."
    ID_PREFIX: ClassVar[str] = "vllm"

    engine_url: str = setting(
        "",
        "URL of a running `vllm serve` (http://host:port; comma-separated, one per worker); "
        "empty = run vLLM in this process",
    )
    kv_events_endpoint: str = setting(
        "",
        "Remote mode: the ZMQ endpoint `vllm serve --kv-events-config` publishes on "
        "(tcp://host:5557; comma-separated, one per worker); empty = no KV events",
    )
    kv_replay_endpoint: str = setting(
        "",
        "Remote mode: the publisher's replay endpoint (comma-separated, one per worker); "
        "empty = gaps are not replayed",
    )
    kv_events_topic: str = setting("", "Remote mode: the KV events topic the server publishes")
    vllm_model: str = setting(
        "",
        "In-process mode: the model vLLM loads, a Hugging Face id or a directory "
        "(empty = --model-path)",
    )
    block_size: int = setting(
        16,
        "KV block size in tokens (in-process: given to vLLM; remote: the server's --block-size)",
        ge=1,
    )
    kv_blocks: int = setting(
        0, "Remote mode: the server's KV cache size in blocks, for the worker card", ge=0
    )
    max_num_seqs: int = setting(256, "Most requests running at once per engine", ge=1)
    gpu_memory_utilization: float = setting(
        0.9, "In-process mode: the share of GPU memory vLLM may use", gt=0, le=1
    )
    max_model_len: int = setting(0, "In-process mode: context length (0 = the model's own)", ge=0)
    tensor_parallel_size: int = setting(1, "In-process mode: GPUs per engine", ge=1)
    dtype: str = setting("auto", "In-process mode: the weights' dtype (vLLM's --dtype)")
    enforce_eager: bool = setting(False, "In-process mode: no CUDA graphs (faster start)")
    metrics_interval_s: float = setting(
        1.0, "Remote mode: poll the server's /metrics this often for load (0 = never)", ge=0
    )
    engine_startup_timeout_s: float = setting(
        600.0, "Remote mode: wait this long for a `vllm serve` that is still loading", ge=0
    )
    engine_api_key: str = setting("", "Remote mode: bearer token for `vllm serve --api-key`")

    def __post_init__(self) -> None:
        WorkerConfig.__post_init__(self)
        urls = _split(self.engine_url)
        if urls and len(urls) not in (1, self.num_workers):
            raise SettingError(
                f"--engine-url lists {len(urls)} servers for {self.num_workers} workers"
            )
        if urls and len(urls) == 1 and self.num_workers > 1:
            raise SettingError("--num-workers > 1 needs one --engine-url per worker")
        for name in ("kv_events_endpoint", "kv_replay_endpoint"):
            listed = _split(getattr(self, name))
            if listed and len(listed) != max(1, len(urls)):
                raise SettingError(f"--{name.replace('_', '-')} needs one endpoint per server")
        if not urls and self.num_workers > 1:
            raise SettingError("in-process mode runs one vLLM engine per process (--num-workers 1)")
        if not urls and self.kv_events_endpoint:
            raise SettingError("--kv-events-endpoint is for remote mode (--engine-url)")

    @property
    def remote(self) -> bool:
        return bool(self.engine_url.strip())

    def engine_urls(self) -> list[str]:
        return _split(self.engine_url)

    def remote_endpoints(self, index: int) -> tuple[str | None, str | None]:
        """``(kv events, replay)`` endpoints of worker ``index`` in remote mode."""
        events = _split(self.kv_events_endpoint)
        replay = _split(self.kv_replay_endpoint)
        return (
            events[index] if index < len(events) else None,
            replay[index] if index < len(replay) else None,
        )
