"""Plots of ``bench.routing``'s results: KV hit rate and TTFT by routing mode (part b), routing
decision latency by fleet size (part a, also from lines labelled by ``tree``)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from bench.plot_canvas import Record, group_colours, new_figure

DECIDE_KEY = re.compile(r"^decide_(\d+)tok_(hit|miss)(_hashed_here)?$")
DECIDE_STYLES = {"hit": "-", "miss": "--", "hit_hashed_here": ":"}
DecideTable = dict[tuple[str, int, str], dict[int, float]]
"""(tree label, prompt tokens, hit/miss kind) → fleet size → decision p50 µs."""


def routing_modes(records: Sequence[Record]) -> list[tuple[str, Record]]:
    """(mode, summary) of every ``bench.routing`` part (b) in the records, in order."""
    return [
        (str(mode), summary)
        for record in records
        if isinstance(record.get("b"), Mapping)
        for mode, summary in record["b"].items()
    ]


def plot_hit_rate(modes: Sequence[tuple[str, Record]], path: Path) -> Path:
    """KV hit rate by routing mode, and TTFT p50 / p99 by mode beside it."""
    first = modes[0][1]
    title = (
        f"bench.routing (b), shared-prefix workload: c={first.get('concurrency')}, "
        f"{first.get('requests')} requests, {first.get('max_tokens')} tokens"
    )
    figure, (hits, ttft) = new_figure(2, title)
    names = [mode for mode, _ in modes]
    colours = group_colours(names)
    positions = range(len(modes))
    rates = [float(summary.get("kv_hit_rate") or 0.0) for _, summary in modes]
    bars = hits.bar(positions, rates, color=[colours[n] for n in names])
    hits.bar_label(bars, labels=[f"{r:.3f}" for r in rates], fontsize=8)
    hits.set_ylabel("KV hit rate (cached / prompt tokens)")
    hits.set_ylim(0, 1.05)
    width = 0.38
    for offset, key, shade in ((-width / 2, "ttft_ms_p50", 1.0), (width / 2, "ttft_ms_p99", 0.5)):
        values = [float(summary.get(key) or 0.0) for _, summary in modes]
        bars = ttft.bar(
            [p + offset for p in positions],
            values,
            width,
            color=[colours[n] for n in names],
            alpha=shade,
            label=key.removeprefix("ttft_ms_"),
        )
        ttft.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7)
    ttft.set_ylabel("TTFT, ms")
    ttft.legend(fontsize=8)
    for ax in (hits, ttft):
        ax.set_xticks(list(positions), names)
        ax.set_xlabel("routing mode")
    figure.savefig(path, dpi=110)
    return path


def _part_a(records: Sequence[Record]) -> Iterator[Record]:
    """Part (a) results: the values of a ``bench.routing`` object's ``a``, or lines that are one
    (as in ``docs/bench/*-router-fleet.jsonl``, labelled by ``tree``)."""
    for record in records:
        if isinstance(record.get("a"), Mapping):
            yield from record["a"].values()
        elif "workers" in record and any(DECIDE_KEY.match(k) for k in record):
            yield record


def decide_table(records: Sequence[Record]) -> DecideTable:
    """(tree label, prompt tokens, hit/miss kind) → fleet size → decision p50 µs, the median
    over the rounds of that label and size."""
    samples: dict[tuple[str, int, str], dict[int, list[float]]] = {}
    for result in _part_a(records):
        for key, stats in result.items():
            if match := DECIDE_KEY.match(key):
                line = (str(result.get("tree", "")), int(match[1]), match[2] + (match[3] or ""))
                by_size = samples.setdefault(line, {})
                by_size.setdefault(int(result["workers"]), []).append(float(stats["p50_us"]))
    return {
        line: {n: statistics.median(v) for n, v in sorted(by_size.items())}
        for line, by_size in samples.items()
    }


def plot_decide_latency(table: DecideTable, path: Path) -> Path:
    """Routing decision p50 by fleet size (``decide_table``'s), a panel per prompt length; hit,
    miss and hit hashed in the router as line styles, a colour per tree label."""
    lengths = sorted({tokens for _, tokens, _ in table})
    figure, axes = new_figure(
        len(lengths), "bench.routing (a): routing decision p50 by fleet size, median of the runs"
    )
    colours = group_colours([tree for tree, _, _ in table])
    for ax, tokens in zip(axes, lengths, strict=True):
        lines = {(tree, kind): v for (tree, length, kind), v in table.items() if length == tokens}
        for (tree, kind), by_size in lines.items():
            label = f"{tree}: {kind}" if tree else kind
            ax.plot(
                list(by_size),
                list(by_size.values()),
                marker="o",
                color=colours[tree],
                linestyle=DECIDE_STYLES[kind],
                label=label.replace("_", " "),
            )
        ax.set_xscale("log", base=2)
        sizes = sorted({n for by_size in lines.values() for n in by_size})
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("workers in the fleet")
        ax.set_ylabel("decision p50, µs")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{tokens}-token prompts", fontsize=10)
        ax.grid(True, color="0.92")
        ax.legend(fontsize=7)
    figure.savefig(path, dpi=110)
    return path
