"""Per-request samples in the benches' JSON: bounded order statistics, in ms; the kit's
client run through ``bench/loadgen_samples.py`` keeps its own summary and adds them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.httpclient import Record
from bench.loadgen_samples import main as loadgen_main
from bench.loadgen_samples import request_samples
from bench.samples import MAX_SAMPLES, bounded, latency_samples, without_samples
from bench.serving import summarize
from bench.side_by_side_report import run_line


def test_bounded_keeps_every_value_up_to_the_limit_sorted_in_ms() -> None:
    assert bounded([0.003, 0.001, 0.0025]) == [1.0, 2.5, 3.0]


def test_bounded_keeps_min_max_and_even_order_statistics_above_the_limit() -> None:
    values = [i / 1000 for i in range(2001)]  # 0 .. 2000 ms
    kept = bounded(values, limit=5)
    assert kept == [0.0, 500.0, 1000.0, 1500.0, 2000.0]
    assert len(bounded(values)) == MAX_SAMPLES


def test_without_samples_leaves_them_out_at_any_depth_and_keeps_the_rest() -> None:
    record = {
        "a": {"16": {"p50_us": 30.0}},
        "b": {"kv": {"kv_hit_rate": 0.9, "samples": {"ttft_ms": [1.0]}}},
        "samples": {"ttft_ms": [2.0]},
    }
    assert without_samples(record) == {
        "a": {"16": {"p50_us": 30.0}},
        "b": {"kv": {"kv_hit_rate": 0.9}},
    }
    assert record["samples"] == {"ttft_ms": [2.0]}  # the record itself is left as it was


def test_latency_samples_counts_the_requests_they_stand_for() -> None:
    out = latency_samples([0.001] * 1200, [0.00003] * 1200)
    assert out["requests"] == 1200
    assert len(out["ttft_ms"]) == MAX_SAMPLES  # type: ignore[arg-type]


def test_serving_summary_keeps_the_samples_of_successful_requests() -> None:
    records = [
        Record(ok=True, ttft_s=0.004, e2e_s=0.0071, completion_tokens=32),
        Record(ok=True, ttft_s=0.002, e2e_s=0.0051, completion_tokens=32),
        Record(error="status 503"),
    ]
    line = summarize("a", {"concurrency": 1}, records, 1.0, {"total": 0.0})
    assert line["samples"] == {"requests": 2, "ttft_ms": [2.0, 4.0], "itl_ms": [0.1, 0.1]}


def test_run_line_passes_the_clients_samples_through() -> None:
    summary = {"ttft_ms_p50": 2.0, "samples": {"requests": 1, "ttft_ms": [2.0], "itl_ms": [0.03]}}
    assert run_line("dynamo", 1, summary, 0.5)["samples"] == summary["samples"]
    assert "samples" not in run_line("dynamo", 1, {"ttft_ms_p50": 2.0}, 0.5)


def test_request_samples_compute_itl_as_the_kit_does() -> None:
    results: list[dict[str, Any]] = [
        {"ok": True, "ttft": 0.002, "e2e": 0.0051, "completion_tokens": 32, "chunks": 31},
        {"ok": True, "ttft": 0.003, "e2e": 0.0033, "completion_tokens": None, "chunks": 4},
        {"ok": True, "ttft": 0.004, "e2e": 0.004, "completion_tokens": 1, "chunks": 1},
        {"ok": False, "ttft": None, "e2e": 0.1, "completion_tokens": None, "chunks": 0},
    ]
    out = request_samples(results)
    assert out == {"requests": 3, "ttft_ms": [2.0, 3.0, 4.0], "itl_ms": [0.1, 0.1]}


FAKE_LOADGEN = """
import json, sys

def summarize(args, model, wall, results):
    return {"model": model, "ttft_ms_p50": 2.0}

def main():
    results = [{"ok": True, "ttft": 0.002, "e2e": 0.0051, "completion_tokens": 32, "chunks": 32}]
    print(json.dumps({"argv": sys.argv[1:], **summarize(None, "M", 1.0, results)}))
    return 0
"""


def test_loadgen_runs_unchanged_with_samples_added(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "loadgen.py"
    fake.write_text(FAKE_LOADGEN)
    monkeypatch.setattr("sys.argv", ["unchanged"])
    assert loadgen_main([str(fake), "-c", "1", "--compact"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["argv"] == ["-c", "1", "--compact"]
    assert printed["ttft_ms_p50"] == 2.0
    assert printed["samples"] == {"requests": 1, "ttft_ms": [2.0], "itl_ms": [0.1]}
