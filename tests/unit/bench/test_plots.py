"""Bench plots: records shaped as the benches write them → PNG files, one-sided without a
reference run, nothing drawn from percentile-only records."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import pytest

from bench.plots import SIDE_BY_SIDE, latency_figures, load, plot_latency, report, write_plots
from bench.routing_plots import decide_table, plot_decide_latency, plot_hit_rate, routing_modes
from bench.samples import latency_samples

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib (the bench extra)"
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIN_PNG_BYTES = 10_000
"""Axes, labels and curves: an empty or failed figure is a few kB at most."""


def samples(ttft_ms: float, n: int = 200, seed: int = 1) -> dict[str, object]:
    rng = random.Random(seed)
    ttft = [rng.lognormvariate(0, 0.3) * ttft_ms / 1000 for _ in range(n)]
    itl = [rng.uniform(20, 40) / 1e6 for _ in range(n)]
    return latency_samples(ttft, itl)


def side_by_side_line(system: str, round_no: int, ttft_ms: float) -> dict[str, Any]:
    return {
        "system": system,
        "round": round_no,
        "ttft_ms_p50": ttft_ms,
        "ttft_ms_p99": ttft_ms * 2,
        "itl_ms_p50": 0.03,
        "cpu_ms_per_req": {"server": 5.0},
        "ok": 200,
        "errors": 0,
        "samples": samples(ttft_ms, seed=round_no),
    }


def serving_line(workload: str, protocol: str, ttft_ms: float) -> dict[str, Any]:
    spec = {"a": (1, 200, 32), "b": (64, 2000, 64)}[workload]
    return {
        "workload": workload,
        "protocol": protocol,
        "concurrency": spec[0],
        "requests": spec[1],
        "max_tokens": spec[2],
        "ttft_ms_p50": ttft_ms,
        "samples": samples(ttft_ms),
    }


def part_a(workers: int, scale: float, **extra: Any) -> dict[str, Any]:
    def stats(p50: float) -> dict[str, float]:
        return {"p50_us": p50 * scale, "p99_us": p50 * scale * 2, "mean_us": p50, "n": 500}

    return {
        "workers": workers,
        "decide_1024tok_hit": stats(30 + workers / 64),
        "decide_1024tok_miss": stats(20 + workers / 64),
        "decide_8192tok_hit": stats(70 + workers / 64),
        "decide_8192tok_miss": stats(20 + workers / 32),
        "hash_1024tok": stats(25),
        **extra,
    }


def routing_object() -> dict[str, Any]:
    def mode(hit: float, ttft: float) -> dict[str, Any]:
        return {
            "workload": f"shared-prefix/{'kv' if hit > 0.8 else 'round-robin'}",
            "concurrency": 16,
            "requests": 400,
            "max_tokens": 32,
            "ttft_ms_p50": ttft,
            "ttft_ms_p99": ttft * 3,
            "kv_hit_rate": hit,
            "samples": samples(ttft),
        }

    return {
        "a": {str(n): part_a(n, 1.0) for n in (16, 256, 1024)},
        "b": {"kv": mode(0.92, 68.0), "round-robin": mode(0.69, 73.0)},
    }


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > MIN_PNG_BYTES


class TestLatency:
    @needs_matplotlib
    def test_side_by_side_with_reference_draws_both_systems(self, tmp_path: Path) -> None:
        lines = [
            side_by_side_line(s, r, t)
            for r in (1, 2)
            for s, t in (("dynamo", 2.6), ("jetserve", 4.3))
        ]
        figure = latency_figures(lines)[SIDE_BY_SIDE]
        assert [s.label for s in figure.series if s.is_reference] == ["dynamo #1", "dynamo #2"]
        assert "no reference" not in figure.title
        assert_png(plot_latency(figure.series, tmp_path / "c1.png", figure.title))

    @needs_matplotlib
    def test_without_reference_the_plot_is_one_sided(self, tmp_path: Path) -> None:
        lines = [side_by_side_line("jetserve", r, 4.0) for r in (1, 2)]
        figure = latency_figures(lines)[SIDE_BY_SIDE]
        assert not any(s.is_reference for s in figure.series)
        assert figure.title.endswith("(no reference run)")
        assert_png(plot_latency(figure.series, tmp_path / "c1.png", figure.title))

    def test_serving_lines_make_a_figure_per_workload_and_number_repeats(self) -> None:
        lines = [
            serving_line("a", "http", 3.8),
            serving_line("a", "grpc", 4.1),
            serving_line("b", "http", 60.0),
            serving_line("a", "http", 3.9),
        ]
        figures = latency_figures(lines)
        assert sorted(figures) == ["workload-a", "workload-b"]
        assert [s.label for s in figures["workload-a"].series] == ["http", "grpc", "http #2"]
        assert "c=64" in figures["workload-b"].title

    def test_percentile_only_records_draw_nothing(self) -> None:
        line = side_by_side_line("dynamo", 1, 2.6)
        del line["samples"]
        assert latency_figures([line, {"summary": "c1-side-by-side"}]) == {}

    def test_ttft_samples_are_the_recorded_ones(self) -> None:
        line = serving_line("a", "http", 3.8)
        (series,) = latency_figures([line])["workload-a"].series
        assert series.ttft_ms == line["samples"]["ttft_ms"]


class TestRouting:
    @needs_matplotlib
    def test_hit_rate_by_mode(self, tmp_path: Path) -> None:
        modes = routing_modes([routing_object()])
        assert [m for m, _ in modes] == ["kv", "round-robin"]
        assert_png(plot_hit_rate(modes, tmp_path / "hit.png"))

    def test_decide_table_takes_the_median_over_rounds_per_tree(self) -> None:
        lines = [
            part_a(16, scale, tree="before", round=r) for r, scale in ((1, 1.0), (2, 3.0), (3, 2.0))
        ]
        lines.append(part_a(16, 0.5, tree="after", round=1))
        table = decide_table(lines)
        assert table[("before", 1024, "hit")] == {16: 60.5}
        assert table[("after", 8192, "miss")] == {16: 10.25}
        assert not any(kind.startswith("hash") for _, _, kind in table)

    @needs_matplotlib
    def test_decide_latency_by_fleet_size(self, tmp_path: Path) -> None:
        assert_png(plot_decide_latency(decide_table([routing_object()]), tmp_path / "decide.png"))


class TestFiles:
    @needs_matplotlib
    def test_routing_object_gives_latency_hit_rate_and_decide_plots(self, tmp_path: Path) -> None:
        path = tmp_path / "routing.json"
        path.write_text(json.dumps(routing_object(), indent=1))
        written = write_plots(path)
        names = sorted(p.name for p in written)
        assert names == [
            "routing-decide.png",
            "routing-hit-rate.png",
            "routing-latency-by-mode.png",
        ]
        for png in written:
            assert_png(png)

    @needs_matplotlib
    def test_json_lines_with_remarks_are_read(self, tmp_path: Path) -> None:
        path = tmp_path / "bench.jsonl"
        lines = [serving_line("a", "http", 3.8), side_by_side_line("jetserve", 1, 4.0)]
        text = "side by side: Dynamo kit not installed\n" + "\n".join(map(json.dumps, lines))
        path.write_text(text + "\n")
        assert len(load(path)) == 2
        written = write_plots(path)
        assert sorted(p.name for p in written) == [
            "bench-c1-side-by-side.png",
            "bench-workload-a.png",
        ]

    @needs_matplotlib
    def test_report_says_when_there_is_nothing_to_draw(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = tmp_path / "old.jsonl"
        path.write_text(json.dumps({"system": "dynamo", "round": 1, "ttft_ms_p50": 2.6}) + "\n")
        assert report(path) == []
        assert "plots skipped: nothing to draw" in capsys.readouterr().out

    def test_report_without_matplotlib_skips(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = tmp_path / "bench.jsonl"
        path.write_text(json.dumps(serving_line("a", "http", 3.8)) + "\n")
        monkeypatch.setattr("bench.plots.has_matplotlib", lambda: False)
        assert report(path) == []
        assert "matplotlib is not installed" in capsys.readouterr().out
        assert list(tmp_path.glob("*.png")) == []
