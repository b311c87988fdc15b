"""``make bench-lora``'s pure parts: Zipf weights, the static layout, the summary and table."""

from __future__ import annotations

import pytest

from bench.lora_report import Sample, draw, static_layout, summary, table, zipf_weights


def test_zipf_weights_are_normalized_and_falling() -> None:
    weights = zipf_weights(8, 1.0)
    assert sum(weights) == pytest.approx(1.0)
    assert weights == sorted(weights, reverse=True)
    assert weights[0] == pytest.approx(1 / sum(1 / k for k in range(1, 9)))


def test_draws_are_seeded() -> None:
    names = ["a", "b", "c"]
    assert draw(names, [0.5, 0.3, 0.2], 50, seed=3) == draw(names, [0.5, 0.3, 0.2], 50, seed=3)


def test_static_layout_puts_adapter_i_on_worker_i_mod_n() -> None:
    assert static_layout([f"l{i}" for i in range(8)], 4) == [
        ["l0", "l4"],
        ["l1", "l5"],
        ["l2", "l6"],
        ["l3", "l7"],
    ]


def test_summary_counts_only_served_requests() -> None:
    samples = [Sample("a", 0.1, 10), Sample("a", 0.3, 10), Sample("b", 0.0, 0, ok=False)]
    figures = summary(samples, elapsed_s=2.0)
    assert figures["tok_s"] == 10.0
    assert figures["failed"] == 1
    assert figures["ttft_p99_ms"] == pytest.approx(300.0)


def test_table_has_a_line_per_run() -> None:
    row = {"arm": "static", "round": 0, "requests": 2, "failed": 0}
    row |= {"tok_s": 1.0, "ttft_p50_ms": 2.0, "ttft_p99_ms": 3.0}
    assert len(table([row, row]).splitlines()) == 4
