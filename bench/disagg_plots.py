"""Plots of ``bench.disagg``'s JSON lines, as PNGs beside the file.

    python -m bench.disagg_plots FILE [FILE ...]

``<stem>-disagg.png``: TTFT p50/p99, ITL p99 with the pooled token gaps' p99, and output tok/s by
concurrency, a bar per (system, mode) at the median of the rounds, each round a dot.
``<stem>-gaps-c<N>.png``: the share of token gaps longer than x (log-log), a curve per run: a
decode step stalled by another request's prefill is the tail. ``<stem>-latency-c<N>.png``: TTFT
and per-request ITL CDFs (``bench.plots.plot_latency``), Dynamo dashed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench import plots
from bench.disagg_report import BENCH
from bench.plot_canvas import Record, group_colours, log_x, new_figure
from bench.side_by_side_report import DYNAMO

PANELS = (
    ("TTFT, ms", (("ttft_ms_p50", "p50", 1.0), ("ttft_ms_p99", "p99", 0.5))),
    ("ITL p99, ms", (("itl_ms_p99", "per request", 1.0), ("chunk_gap_ms_p99", "gaps", 0.5))),
    ("output tokens/s", (("output_tok_s", "", 1.0),)),
)
"""Each bar panel: its y label and its (key, legend, shade) bars per series."""
MIN_GAP_MS = 1.0
"""Left edge of the gap plot: shorter gaps are chunks that came in one read, not decode steps."""


def runs(records: Sequence[Record]) -> list[Record]:
    """The lines of ``bench.disagg`` runs that measured something."""
    return [r for r in records if r.get("bench") == BENCH and "mode" in r and r.get("ttft_ms_p50")]


def series_name(record: Record) -> str:
    return f"{record['system']} {record['mode']}"


def plot_bars(lines: Sequence[Record], path: Path) -> Path:
    """A panel per ``PANELS`` entry: concurrency groups, a bar per (system, mode) and key at
    the median of its rounds, each round a dot."""
    names = list(dict.fromkeys(series_name(r) for r in lines))
    levels = sorted({int(r["concurrency"]) for r in lines})
    colours = group_colours([n.split()[0] for n in names])
    first = lines[0]
    title = (
        f"bench.disagg: {first.get('prompt_words')}-{first.get('prompt_words_max')} words, "
        f"{first.get('max_tokens')} output tokens; bars: median of "
        f"{max(int(r['round']) for r in lines)} round(s), dots: each round"
    )
    figure, axes = new_figure(len(PANELS), title)
    for ax, (ylabel, bars) in zip(axes, PANELS, strict=True):
        slots = [(n, bar) for n in names for bar in bars]
        width = 0.8 / len(slots)
        for i, (name, (key, legend, shade)) in enumerate(slots):
            colour = colours[name.split()[0]]
            hatch = "//" if name.endswith(" agg") else None
            xs, medians = [], []
            for x, c in enumerate(levels):
                values = [
                    float(r[key])
                    for r in lines
                    if series_name(r) == name and int(r["concurrency"]) == c and r.get(key)
                ]
                if values:
                    at = x - 0.4 + width * (i + 0.5)
                    xs.append(at)
                    medians.append(statistics.median(values))
                    ax.plot([at] * len(values), values, ".", color="0.25", markersize=3)
            label = f"{name} {legend}".strip()
            ax.bar(xs, medians, width, color=colour, alpha=shade, hatch=hatch, label=label)
        ax.set_xticks(range(len(levels)), [f"c={c}" for c in levels])
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", color="0.92")
        ax.legend(fontsize=6)
    figure.savefig(path, dpi=110)
    return path


def plot_gap_tail(lines: Sequence[Record], path: Path, concurrency: int) -> Path:
    """The share of pooled token gaps longer than x, log-log, a curve per run at
    ``concurrency`` (Dynamo dashed): the tail is decode steps stalled by prefills."""
    figure, (ax,) = new_figure(1, f"bench.disagg, c={concurrency}: token gaps longer than x")
    chosen = [r for r in lines if int(r["concurrency"]) == concurrency]
    names = [series_name(r) for r in chosen]
    colours = group_colours(names)
    for record, name in zip(chosen, names, strict=True):
        gaps = sorted((record.get("samples") or {}).get("gap_ms") or [])
        if not gaps:
            continue
        longer = [1.0 - i / len(gaps) for i in range(len(gaps))]
        ax.step(
            gaps,
            longer,
            where="post",
            color=colours[name],
            linestyle="--" if record["system"] == DYNAMO else "-",
            label=f"{name} #{record['round']}: p99 {record.get('chunk_gap_ms_p99')} ms",
        )
    log_x(ax)
    ax.set_xlim(left=MIN_GAP_MS)
    ax.set_yscale("log")
    ax.set_xlabel("gap between two streamed chunks, ms")
    ax.set_ylabel("share of gaps longer")
    ax.grid(True, which="both", color="0.92")
    ax.legend(fontsize=7)
    figure.savefig(path, dpi=110)
    return path


def latency_series(lines: Sequence[Record], concurrency: int) -> list[plots.Series]:
    """A ``bench.plots`` series per run at ``concurrency``, a colour per (system, mode)."""
    return [
        plots.Series(
            f"{series_name(r)} #{r['round']}",
            series_name(r),
            r["samples"]["ttft_ms"],
            r["samples"]["itl_ms"],
            is_reference=r["system"] == DYNAMO,
        )
        for r in lines
        if int(r["concurrency"]) == concurrency and isinstance(r.get("samples"), Mapping)
    ]


def write_plots(path: Path) -> list[Path]:
    """Every plot the lines of ``path`` allow; the files written."""
    lines = runs(plots.load(path))
    if not lines:
        return []
    written = [plot_bars(lines, plots.beside(path, "disagg"))]
    for c in sorted({int(r["concurrency"]) for r in lines}):
        written.append(plot_gap_tail(lines, plots.beside(path, f"gaps-c{c}"), c))
        if series := latency_series(lines, c):
            title = f"bench.disagg, c={c}: TTFT and per-request ITL"
            written.append(plots.plot_latency(series, plots.beside(path, f"latency-c{c}"), title))
    return written


def report(path: Path) -> list[Path]:
    """Draw ``path``'s plots and print where they are, or that they were skipped."""
    if not plots.has_matplotlib():
        return plots.report(path)  # says the plots were skipped
    written = write_plots(path)
    print(
        "plots: " + " ".join(str(p) for p in written)
        if written
        else f"plots skipped: no measured bench.disagg run in {path}",
        flush=True,
    )
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.disagg_plots", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path, help="bench.disagg JSON lines")
    args = parser.parse_args(argv)
    return int(not all([report(path) for path in args.files]))


if __name__ == "__main__":
    sys.exit(main())
