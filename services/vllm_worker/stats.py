"""The engine's own view of its load. Pure: a record, and a parser for ``vllm serve``'s
Prometheus text.

In-process, ``loader`` registers a vLLM stat logger whose ``record(scheduler_stats, ...)``
(``vllm/v1/metrics/loggers.py`` ``StatLoggerBase``) copies ``num_running_reqs``,
``num_waiting_reqs`` and ``kv_cache_usage`` into a ``SchedulerSnapshot``. Remotely, the worker
polls ``GET /metrics`` for the same three gauges (``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``; before vLLM 0.10
``vllm:gpu_cache_usage_perc``), and reads the KV cache's geometry from the labels of
``vllm:cache_config_info`` (``block_size``, ``num_gpu_blocks``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["SchedulerSnapshot", "parse_cache_config", "parse_prometheus"]

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_CACHE_INFO = "vllm:cache_config_info"
_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass(slots=True)
class SchedulerSnapshot:
    """The engine's last scheduler stats (``seen`` False until the first arrive): with
    data-parallel ranks (one vLLM engine core each, ``engine``), their sums and mean usage."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    """Fraction of the KV cache in use, 0..1."""
    seen: bool = False
    engines: dict[int, tuple[int, int, float]] = field(default_factory=dict)
    """Each engine core's last ``(running, waiting, kv_usage)``."""

    def update(self, *, running: int, waiting: int, kv_usage: float, engine: int = 0) -> None:
        self.engines[engine] = (max(0, running), max(0, waiting), min(1.0, max(0.0, kv_usage)))
        values = self.engines.values()
        self.running = sum(v[0] for v in values)
        self.waiting = sum(v[1] for v in values)
        self.kv_usage = sum(v[2] for v in values) / len(self.engines)
        self.seen = True

    def used_blocks(self, total: int) -> int:
        return round(self.kv_usage * total)


def parse_prometheus(text: str) -> tuple[int, int, float] | None:
    """``(running, waiting, kv_usage)`` summed over the text's samples (one engine per
    server, or its data-parallel ranks); None without the running gauge."""
    running = waiting = 0.0
    usage: list[float] = []
    found = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        base = match.group(1)
        try:
            value = float(match.group(2))
        except ValueError:
            continue
        if base == _RUNNING:
            running += value
            found = True
        elif base == _WAITING:
            waiting += value
        elif base in _USAGE:
            usage.append(value)
    if not found:
        return None
    kv = sum(usage) / len(usage) if usage else 0.0
    return int(running), int(waiting), kv


def parse_cache_config(text: str) -> tuple[int, int] | None:
    """``(block_size, num_gpu_blocks)`` from the labels of ``vllm:cache_config_info`` (vLLM
    exports its ``CacheConfig`` as an info gauge); None when absent or unparsable."""
    for line in text.splitlines():
        if not line.startswith(_CACHE_INFO + "{"):
            continue
        labels = dict(_LABEL.findall(line[len(_CACHE_INFO) :]))
        try:
            return int(labels["block_size"]), int(labels["num_gpu_blocks"])
        except (KeyError, ValueError):
            return None
    return None
