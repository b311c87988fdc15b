"""Plots of a bench's JSON (``make bench``, ``bench-c1``, ``bench-routing``), as PNGs beside it.

    python -m bench.plots FILE [FILE ...]

TTFT and ITL distributions (CDFs, the reference system beside JetServe when one ran) are drawn
here, ``bench.routing``'s figures in ``bench.routing_plots``: functions from records to a PNG.
matplotlib (the ``bench`` extra) is imported only when drawing, on the Agg canvas; without it
``report`` says the plots were skipped and the bench goes on.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.plot_canvas import Record, group_colours, log_x, new_figure
from bench.routing_plots import decide_table, plot_decide_latency, plot_hit_rate, routing_modes
from bench.side_by_side_report import DYNAMO

if TYPE_CHECKING:
    from matplotlib.axes import Axes

SIDE_BY_SIDE = "c1-side-by-side"
WIDE = 20.0
"""Samples spanning more than this ratio (max / min) are drawn on a log axis."""


@dataclass(frozen=True, slots=True)
class Series:
    """One run's per-request samples: a curve in each panel of a latency figure."""

    label: str
    group: str
    """Curves of one group (a system, protocol or routing mode) share a colour."""
    ttft_ms: Sequence[float]
    itl_ms: Sequence[float]
    is_reference: bool = False


@dataclass(slots=True)
class LatencyFigure:
    title: str
    series: list[Series] = field(default_factory=list)


def load(path: Path) -> list[dict[str, Any]]:
    """The records of a bench file: one JSON object (``bench.routing``) or JSON lines (lines
    that are not a JSON object, such as a bench's remarks in a tee'd log, are skipped)."""
    text = path.read_text()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        lines = (line.strip() for line in text.splitlines())
        return [json.loads(line) for line in lines if line.startswith("{")]
    return value if isinstance(value, list) else [value]


def _latency_entries(record: Record) -> Iterator[tuple[str, str, Series, Record]]:
    """(figure name, title, series without samples, the record holding them) of one record."""
    if "workload" in record and "protocol" in record:  # a bench.serving line
        name, protocol = f"workload-{record['workload']}", str(record["protocol"])
        title = (
            f"bench.serving workload ({record['workload']}): c={record.get('concurrency')}, "
            f"{record.get('requests')} requests, {record.get('max_tokens')} tokens"
        )
        yield name, title, Series(protocol, protocol, (), ()), record
    elif "system" in record and "round" in record:  # a side-by-side run
        system = str(record["system"])
        label = f"{system} #{record['round']}"
        series = Series(label, system, (), (), is_reference=system == DYNAMO)
        yield SIDE_BY_SIDE, "c=1 side by side: workload (a), the kit's client", series, record
    elif isinstance(record.get("b"), Mapping):  # a bench.routing object
        for mode, summary in record["b"].items():
            title = (
                f"bench.routing (b), shared-prefix workload by routing mode: "
                f"c={summary.get('concurrency')}, {summary.get('requests')} requests"
            )
            yield "latency-by-mode", title, Series(mode, mode, (), ()), summary


def latency_figures(records: Sequence[Record]) -> dict[str, LatencyFigure]:
    """Figure name → its series: ``bench.serving`` lines by workload (a series per protocol),
    side-by-side runs (per system and round), ``bench.routing`` part (b) (per mode). Records
    without ``samples`` (percentiles only) are left out; a repeated label gets ``#n``."""
    figures: dict[str, LatencyFigure] = {}
    for record in records:
        for name, title, bare, holder in _latency_entries(record):
            samples = holder.get("samples")
            if not samples or not samples.get("ttft_ms"):
                continue
            figure = figures.setdefault(name, LatencyFigure(title))
            seen = sum(1 for s in figure.series if s.label.split(" #", 1)[0] == bare.label)
            label = f"{bare.label} #{seen + 1}" if seen and "#" not in bare.label else bare.label
            series = Series(
                label, bare.group, samples["ttft_ms"], samples["itl_ms"], bare.is_reference
            )
            figure.series.append(series)
    for name, figure in figures.items():
        if name == SIDE_BY_SIDE and not any(s.is_reference for s in figure.series):
            figure.title += ", JetServe alone (no reference run)"
    return figures


def _cdf(ax: Axes, values: Sequence[float], label: str, colour: str, dashed: bool) -> None:
    ordered = sorted(values)
    fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
    p50 = ordered[len(ordered) // 2]
    ax.step(
        ordered,
        fractions,
        where="post",
        color=colour,
        linestyle="--" if dashed else "-",
        linewidth=1.3,
        label=f"{label}: p50 {p50:.3g} ms",
    )


def plot_latency(series: Sequence[Series], path: Path, title: str) -> Path:
    """TTFT and ITL CDFs side by side, a curve per series (the reference dashed, orange); drawn
    one-sided when no reference ran. Writes ``path`` (PNG) and returns it."""
    figure, axes = new_figure(2, title)
    colours = group_colours([s.group for s in series])
    for ax, metric, what in (
        (axes[0], "ttft_ms", "TTFT"),
        (axes[1], "itl_ms", "ITL (per request: mean gap after the first token)"),
    ):
        values = [(s, list(getattr(s, metric))) for s in series]
        for s, samples in values:
            if samples:
                _cdf(ax, samples, s.label, colours[s.group], s.is_reference)
        everything = [v for _, samples in values for v in samples]
        if everything and min(everything) > 0 and max(everything) / min(everything) > WIDE:
            log_x(ax)
        ax.set_xlabel(f"{what}, ms")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.005)
        for level in (0.5, 0.99):
            ax.axhline(level, color="0.8", linewidth=0.8, zorder=0)
        ax.grid(True, which="both", axis="x", color="0.92")
        ax.legend(fontsize=7, loc="lower right")
    figure.savefig(path, dpi=110)
    return path


def beside(path: Path, name: str) -> Path:
    """``<stem>-<name>.png`` in the folder of ``path``."""
    return path.with_name(f"{path.stem}-{name}.png")


def write_plots(path: Path) -> list[Path]:
    """Every plot the records of ``path`` allow, as PNGs beside it; the files written."""
    records = load(path)
    written = [
        plot_latency(figure.series, beside(path, name), figure.title)
        for name, figure in latency_figures(records).items()
    ]
    if modes := routing_modes(records):
        written.append(plot_hit_rate(modes, beside(path, "hit-rate")))
    if table := decide_table(records):
        written.append(plot_decide_latency(table, beside(path, "decide")))
    return written


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def report(path: Path) -> list[Path]:
    """What a bench calls at its end: draw ``path``'s plots and print where they are, or print
    that they were skipped (no matplotlib, or nothing plottable in the file)."""
    if not has_matplotlib():
        print("plots skipped: matplotlib is not installed (pip install -e '.[bench]')")
        return []
    written = write_plots(path)
    if written:
        print("plots: " + " ".join(str(p) for p in written), flush=True)
    else:
        print(f"plots skipped: nothing to draw in {path} (no samples, no routing results)")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path, help="a bench's JSON or JSON-lines file")
    args = parser.parse_args(argv)
    if not has_matplotlib():
        report(args.files[0])
        return 1
    for path in args.files:
        report(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
