"""Figure helpers of the bench plots: panels on the Agg canvas (no pyplot, no global state),
a colour per group with the reference system always orange, plain-number log axes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bench.side_by_side_report import DYNAMO

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Record = Mapping[str, Any]
"""One JSON object a bench wrote."""


def new_figure(ncols: int, title: str) -> tuple[Figure, list[Axes]]:
    """A figure of ``ncols`` panels on the Agg canvas (no pyplot: no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.6 * ncols, 4.4), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title, fontsize=11)
    return figure, list(figure.subplots(1, ncols, squeeze=False)[0])


def group_colours(groups: Sequence[str]) -> dict[str, str]:
    """A colour per group, in order of appearance; the reference system always orange."""
    cycle = ["tab:blue", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:cyan"]
    ordered = [g for g in dict.fromkeys(groups) if g != DYNAMO]
    return {DYNAMO: "tab:orange", **{g: cycle[i % len(cycle)] for i, g in enumerate(ordered)}}


def log_x(ax: Axes) -> None:
    """A log x axis labelled in plain numbers: 1, 2, 5, 10, 20, 50 …"""
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(
        FuncFormatter(lambda v, _: f"{v:g}" if f"{v:e}"[0] in "25" else "")
    )
    ax.tick_params(axis="x", which="both", labelsize=8)
