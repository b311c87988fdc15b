"""Mocker metrics: per-worker gauges from the load, counters advanced by what the stats gained."""

from __future__ import annotations

from shared.worker.metrics import WorkerMetrics
from shared.worker.records import EngineLoad, EngineStats


def test_observe_sets_gauges_and_advances_counters() -> None:
    metrics = WorkerMetrics()
    load = EngineLoad(active=3, waiting=2, kv_used_blocks=10, kv_total_blocks=64, prefill_tokens=5)
    metrics.observe("w", load, EngineStats(prompt_tokens=100, cache_hit_tokens=32))
    metrics.observe("w", load, EngineStats(prompt_tokens=150, cache_hit_tokens=48, preemptions=1))
    text = metrics.service.exposition().decode()
    for line in (
        'jetserve_mocker_kv_blocks_used{worker_id="w"} 10.0',
        'jetserve_mocker_kv_blocks_total{worker_id="w"} 64.0',
        'jetserve_mocker_active_requests{worker_id="w"} 3.0',
        'jetserve_mocker_waiting_requests{worker_id="w"} 2.0',
        'jetserve_mocker_prompt_tokens_total{worker_id="w"} 150.0',
        'jetserve_mocker_prefix_cache_hit_tokens_total{worker_id="w"} 48.0',
        'jetserve_mocker_preemptions_total{worker_id="w"} 1.0',
    ):
        assert line in text
