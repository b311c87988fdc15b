"""The side-by-side c=1 report. Pure: a client's JSON summary → one line per run → medians per
system and the JetServe/Dynamo TTFT ratio. No I/O, no clock; ``bench.side_by_side`` runs things.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

DYNAMO = "dynamo"
JETSERVE = "jetserve"
SERVER = "server"
"""CPU key of every server process together (JetServe: the ``jetserve up`` launcher and its
descendants, measured as one; Dynamo: the sum of its processes)."""
UNATTRIBUTED = "unattributed"
"""CPU key of what the machine used beyond the server and the client: kernel work not charged
to a process, and anything else running (another bench, a test run): noise when it is large."""
NOT_SERVER = frozenset({"loadgen", "machine", "total", SERVER, UNATTRIBUTED})
"""CPU keys that are not one server process: the client, the whole machine, bench.serving's
client + server total, and the server total itself."""
DISTURBED_MS = 1.0
"""``unattributed`` CPU ms per request above which a run is flagged: something else ran (a clean
run on the 2-core machine shows 0 to 0.2)."""
MEDIAN_KEYS = ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "e2e_ms_p50", "req_per_s")


def schedule(rounds: int, systems: Sequence[str]) -> list[tuple[int, str]]:
    """(round, system) in run order: every system once per round, in the order given (A B A B)."""
    return [(r, system) for r in range(1, rounds + 1) for system in systems]


def parse_summary(stdout: str) -> dict[str, Any]:
    """The last JSON object printed on a line of ``stdout``; ``ValueError`` when there is none."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    raise ValueError(f"no JSON summary in the client's output: {stdout[-300:]!r}")


def split_cpu(cpu: Mapping[str, float | None]) -> dict[str, float]:
    """CPU ms per request per process, plus ``server`` (all server processes) and, when
    ``server`` was measured as one tree, ``launcher``: what the tree used beyond the named
    processes (the launcher itself and anything unnamed); with ``machine``, also
    ``unattributed``: the machine's CPU beyond the server and the client."""
    out = {k: float(v) for k, v in cpu.items() if v is not None and k != "total"}
    processes = sum(v for k, v in out.items() if k not in NOT_SERVER)
    if SERVER in out:
        out["launcher"] = round(max(0.0, out[SERVER] - processes), 3)
    else:
        out[SERVER] = round(processes, 3)
    if "machine" in out:
        used = out[SERVER] + out.get("loadgen", 0.0)
        out[UNATTRIBUTED] = round(max(0.0, out["machine"] - used), 3)
    return out


def run_line(
    system: str, round_no: int, summary: Mapping[str, Any], load1: float
) -> dict[str, Any]:
    """One JSON line for one run, from the client's summary (``loadgen.py`` or ``bench.serving``;
    ``load1`` is the 1-minute load average read just before the client started)."""
    line: dict[str, Any] = {"system": system, "round": round_no}
    line.update({k: summary.get(k) for k in MEDIAN_KEYS})
    line["cpu_ms_per_req"] = split_cpu(summary.get("cpu_ms_per_req") or {})
    line["machine_busy_pct"] = summary.get("machine_busy_pct")
    line["loadavg_1m_start"] = round(load1, 2)
    for key in ("ok", "errors", "prompt_tokens_mean", "out_tokens_mean", "prompts_sha256"):
        line[key] = summary.get(key)
    line["client"] = summary.get("client", "bench.serving")
    line["label"] = summary.get("label")
    if "samples" in summary:
        line["samples"] = summary["samples"]
    return line


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def medians(lines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-key medians over the runs of one system (CPU key by key)."""
    out: dict[str, Any] = {"runs": len(lines)}
    for key in (*MEDIAN_KEYS, "loadavg_1m_start", "machine_busy_pct"):
        out[key] = _median(line.get(key) for line in lines)
    cpu_keys = sorted({k for line in lines for k in line["cpu_ms_per_req"]})
    out["cpu_ms_per_req"] = {
        k: _median(line["cpu_ms_per_req"].get(k) for line in lines) for k in cpu_keys
    }
    return out


def checks(lines: Sequence[Mapping[str, Any]], max_tokens: int) -> list[str]:
    """What makes the lines not comparable (the kit README's list): errors, short outputs,
    different prompts across systems; and runs another process disturbed."""
    problems = []
    for line in lines:
        where = f"{line['system']} round {line['round']}"
        if line.get("errors"):
            problems.append(f"{where}: {line['errors']} errors")
        if line.get("out_tokens_mean") not in (None, max_tokens):
            problems.append(f"{where}: out_tokens_mean {line['out_tokens_mean']} != {max_tokens}")
        other = line.get("cpu_ms_per_req", {}).get(UNATTRIBUTED, 0.0)
        if other > DISTURBED_MS:
            problems.append(f"{where}: disturbed, {other} CPU ms/request not from server or client")
    digests = {line.get("prompts_sha256") for line in lines} - {None}
    if len(digests) > 1:
        problems.append(f"prompts differ across runs: {len(digests)} prompts_sha256 values")
    return problems


def summarize(lines: Sequence[Mapping[str, Any]], max_tokens: int) -> dict[str, Any]:
    """The last line: per-system medians of the runs that measured something, the ratio
    JetServe/Dynamo of the TTFT p50 medians (``None`` without both), and ``checks``."""
    measured = [line for line in lines if "error" not in line]
    systems = list(dict.fromkeys(line["system"] for line in lines))
    per_system = {s: medians([line for line in measured if line["system"] == s]) for s in systems}
    ratio = None
    jet, dyn = per_system.get(JETSERVE, {}), per_system.get(DYNAMO, {})
    if jet.get("ttft_ms_p50") and dyn.get("ttft_ms_p50"):
        ratio = round(jet["ttft_ms_p50"] / dyn["ttft_ms_p50"], 2)
    return {
        "summary": "c1-side-by-side",
        "rounds": max((line["round"] for line in lines), default=0),
        "failed_runs": len(lines) - len(measured),
        "medians": per_system,
        "ttft_p50_ratio_jetserve_over_dynamo": ratio,
        "checks": checks(measured, max_tokens),
    }
