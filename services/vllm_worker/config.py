"""vLLM worker configuration: its settings table (``JETSERVE_VLLM_WORKER_*``).

Two modes: in-process (``--engine-url`` empty: each worker loads ``AsyncLLM`` with KV events
on a local ZMQ socket) and remote (``--engine-url``: each worker fronts one running
``vllm serve``; with several workers, one comma-separated URL, KV events endpoint and replay
endpoint per worker, in the same order).

Disaggregated serving (``--role prefill|decode``) needs a KV connector: in-process, the worker's
``--kv-transfer-config`` (vLLM's own flag, a JSON object such as
``{"kv_connector": "NixlConnector", "kv_role": "kv_both"}``); remote, the server's
``vllm serve --kv-transfer-config`` (the worker cannot see it). ``--data-parallel-size`` is
given to vLLM in-process, and in remote mode must equal the server's: the worker pins each
request to its rank and follows each rank's KV events (vLLM offsets a rank's endpoints from the
configured ones, ``ZmqEventPublisher.offset_endpoint_port``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from services.vllm_worker.kv_endpoints import overlapping, rank_sources
from shared.config import SettingError, setting
from shared.worker.config import WorkerConfig

__all__ = ["KV_ROLES", "VllmWorkerConfig", "parse_kv_transfer_config"]

KV_ROLES: dict[str, tuple[str, ...]] = {
    "prefill": ("kv_producer", "kv_both"),
    "decode": ("kv_consumer", "kv_both"),
    "both": ("kv_producer", "kv_consumer", "kv_both"),
}
"""The ``kv_role``s of vLLM's ``KVTransferConfig`` (``vllm/config/kv_transfer.py``) that fit each
worker role: a prefill worker produces KV, a decode worker consumes it."""

PIN_TIMEOUTS: dict[str, tuple[str, float]] = {
    "NixlConnector": ("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", 480.0),
    "MooncakeConnector": ("VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT", 480.0),
}
"""How long a connector keeps a prefill's blocks for a decode instance that never reads them:
its environment variable and vLLM's default (``vllm/envs.py``)."""


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_kv_transfer_config(text: str, role: str) -> dict[str, Any] | None:
    """``--kv-transfer-config`` as vLLM's ``KVTransferConfig`` fields (None when empty); a
    ``SettingError`` for what is not a JSON object naming a ``kv_connector``, or a ``kv_role``
    that does not fit ``role``."""
    if not text.strip():
        return None
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise SettingError(f"--kv-transfer-config is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise SettingError("--kv-transfer-config must be a JSON object (vLLM's KVTransferConfig)")
    connector = parsed.get("kv_connector")
    if not isinstance(connector, str) or not connector:
        raise SettingError(
            '--kv-transfer-config needs a "kv_connector" (e.g. {"kv_connector": '
            '"NixlConnector", "kv_role": "kv_both"})'
        )
    kv_role = parsed.get("kv_role")
    if kv_role is not None and kv_role not in KV_ROLES[role]:
        raise SettingError(
            f'--kv-transfer-config has "kv_role": {kv_role!r}, which a {role} worker cannot use '
            f"(one of {', '.join(KV_ROLES[role])})"
        )
    return parsed


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
    engine_api_key: str = setting(
        "", "Remote mode: bearer token for `vllm serve --api-key`", secret=True
    )
    kv_transfer_config: str = setting(
        "",
        "In-process mode: vLLM's --kv-transfer-config, a JSON object (e.g. "
        '{"kv_connector":"NixlConnector","kv_role":"kv_both"}); needed by --role prefill or '
        "decode (remote mode: give it to `vllm serve`)",
    )

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
        for index in range(len(urls)):
            self._check_rank_endpoints(index)
        kv_transfer = parse_kv_transfer_config(self.kv_transfer_config, self.role)
        if urls and kv_transfer is not None:
            raise SettingError(
                "--kv-transfer-config is for in-process mode: in remote mode the server has it "
                "(vllm serve --kv-transfer-config)"
            )
        if not urls and self.role != "both" and kv_transfer is None:
            raise SettingError(
                f"--role {self.role} needs a KV connector to hand KV between workers: set "
                '--kv-transfer-config (e.g. \'{"kv_connector":"NixlConnector",'
                '"kv_role":"kv_both"}\')'
            )

    def _check_rank_endpoints(self, index: int) -> None:
        """Remote data parallelism: server ``index``'s ranks publish on the endpoints moved by
        their rank (``kv_endpoints``); no two may be the same."""
        events, replay = self.remote_endpoints(index)
        if events is None or self.data_parallel_size == 1:
            return
        try:
            sources = rank_sources(events, replay, "", self.data_parallel_size)
        except ValueError as exc:
            raise SettingError(f"--kv-events-endpoint: {exc}") from exc
        clash = overlapping(sources)
        if clash:
            raise SettingError(
                f"with --data-parallel-size {self.data_parallel_size}, vLLM publishes rank r's KV "
                f"events on {events} and replays on {replay} moved r ports: they overlap at "
                f"{clash[0]} (leave {self.data_parallel_size} ports between them)"
            )

    @property
    def remote(self) -> bool:
        return bool(self.engine_url.strip())

    def kv_transfer(self) -> dict[str, Any] | None:
        """``--kv-transfer-config`` as ``KVTransferConfig`` fields (None: no KV connector)."""
        return parse_kv_transfer_config(self.kv_transfer_config, self.role)

    def kv_pin_timeout_s(self, environ: Mapping[str, str] | None = None) -> float:
        """In-process prefill: how long vLLM's connector keeps a prefill's blocks unread
        (``PIN_TIMEOUTS``; 0 = not known: another connector, or not a prefill worker)."""
        kv_transfer = self.kv_transfer()
        if self.role == "decode" or kv_transfer is None:
            return 0.0
        known = PIN_TIMEOUTS.get(str(kv_transfer.get("kv_connector")))
        if known is None:
            return 0.0
        name, default = known
        value = (os.environ if environ is None else environ).get(name)
        try:
            return float(value) if value else default
        except ValueError:
            return default

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
