"""The disaggregation bench's report. Pure: the run order, each run's seed, a client summary →
one JSON line, the lines → medians, disagg/agg ratios and checks. No I/O, no clock;
``bench.disagg`` runs things.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.side_by_side_report import split_cpu

BENCH = "disagg"
"""Every line's ``bench``: what tells these lines from other benches' in a shared file."""
AGG = "agg"
DISAGG = "disagg"
MODES = (AGG, DISAGG)
REQUIRED_KEYS = (
    "system",
    "mode",
    "concurrency",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "output_tok_s",
)
"""The keys issue 24 asks of every line."""
FIGURES = (
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "chunk_gap_ms_p50",
    "chunk_gap_ms_p99",
    "chunk_gap_ms_p999",
    "e2e_ms_p50",
    "output_tok_s",
    "req_per_s",
)
"""What the summary takes medians of, and the disagg/agg ratios of."""
COPIED = (
    "req_per_s",
    "chunk_gap_ms_p50",
    "chunk_gap_ms_p99",
    "chunk_gap_ms_p999",
    "chunk_gap_ms_max",
    "e2e_ms_p50",
    "e2e_ms_p99",
    "ok",
    "errors",
    "first_errors",
    "prompt_tokens_mean",
    "out_tokens_mean",
    "kv_hit_rate",
    "machine_busy_pct",
    "prompt_words",
    "prompt_words_max",
    "max_tokens",
    "seed",
    "prompts_sha256",
    "client",
    "client_loop",
    "label",
)
"""Client summary keys a line keeps as they are."""
MAX_KV_HIT_RATE = 0.05
"""Every prompt is unique, so a run's KV hit rate must stay near 0 (its prefills all computed)."""


@dataclass(frozen=True, slots=True)
class Stint:
    """One stack started fresh: ``system`` serving in ``mode``, driven at each concurrency in
    turn (a run each), then stopped."""

    round: int
    system: str
    mode: str
    concurrencies: tuple[int, ...]


def schedule(
    rounds: int, systems: Sequence[str], modes: Sequence[str], concurrencies: Sequence[int]
) -> list[Stint]:
    """The stints in run order. Odd rounds go mode by mode, the systems alternating within a
    mode (J-agg D-agg J-disagg D-disagg), concurrencies ascending; even rounds run the same in
    reverse (D-disagg J-disagg D-agg J-agg, concurrencies descending). Each (system, mode)
    pair then sits early in one round and late in the next, and the systems alternate
    throughout."""
    pairs = [(system, mode) for mode in modes for system in systems]
    out = []
    for r in range(1, rounds + 1):
        forward = r % 2 == 1
        order = pairs if forward else pairs[::-1]
        cs = tuple(concurrencies) if forward else tuple(reversed(concurrencies))
        out += [Stint(r, system, mode, cs) for system, mode in order]
    return out


def seed_for(round_no: int, concurrency: int) -> int:
    """The client's ``--seed`` of a run: the same prompts for every system and mode at one
    (round, concurrency), other prompts for the next run on the same stack (no KV reuse)."""
    return 1000 * round_no + concurrency


def requests_for(concurrency: int, per_client: float, minimum: int) -> int:
    """Requests of a run: ``per_client`` per concurrent client, at least ``minimum``."""
    return max(minimum, round(concurrency * per_client))


def worker_layout(mode: str, workers: int) -> str:
    """The fleet of ``workers`` mockers in ``mode``, in words (half prefill, half decode)."""
    if mode == DISAGG:
        return f"{workers // 2} prefill + {workers - workers // 2} decode"
    return f"{workers} aggregated"


def worker_phases(response: Mapping[str, Any]) -> dict[str, Any] | None:
    """``nvext.worker_id`` of a chat completion answered with ``nvext.extra_fields:
    ["worker_id"]`` when it names a prefill worker other than the decode worker (the request
    was disaggregated), else ``None``. Both systems answer ``{"prefill_worker_id": …,
    "decode_worker_id": …}``; Dynamo 1.6.1 does so aggregated too, with one id in both."""
    nvext = response.get("nvext")
    ids = nvext.get("worker_id") if isinstance(nvext, Mapping) else None
    if not isinstance(ids, Mapping) or ids.get("prefill_worker_id") is None:
        return None
    return dict(ids) if ids["prefill_worker_id"] != ids.get("decode_worker_id") else None


def run_line(
    stint: Stint,
    concurrency: int,
    summary: Mapping[str, Any],
    loadavg_start: Sequence[float],
    loadavg_end: Sequence[float],
    **extra: Any,
) -> dict[str, Any]:
    """One JSON line for one run from the client's summary (the kit's ``loadgen.py`` through
    ``bench/loadgen_spread.py``); the load averages are ``os.getloadavg()`` just before the
    client started and just after it ended."""
    line: dict[str, Any] = {
        "bench": BENCH,
        "system": stint.system,
        "mode": stint.mode,
        "concurrency": concurrency,
        "round": stint.round,
        "ttft_ms_p50": summary.get("ttft_ms_p50"),
        "ttft_ms_p99": summary.get("ttft_ms_p99"),
        "itl_ms_p50": summary.get("itl_ms_p50"),
        "itl_ms_p99": summary.get("itl_ms_p99"),
        "output_tok_s": summary.get("out_tok_per_s"),
        "requests": summary.get("num_requests"),
        "duration_s": summary.get("wall_s"),
    }
    line.update({k: summary.get(k) for k in COPIED})
    line["cpu_ms_per_req"] = split_cpu(summary.get("cpu_ms_per_req") or {})
    line["loadavg_start"] = [round(v, 2) for v in loadavg_start]
    line["loadavg_end"] = [round(v, 2) for v in loadavg_end]
    line.update(extra)
    if "samples" in summary:
        line["samples"] = summary["samples"]
    return line


def error_line(stint: Stint, concurrency: int | None, error: str) -> dict[str, Any]:
    """The line of a run (or, ``concurrency`` ``None``, a whole stint) that measured nothing."""
    return {
        "bench": BENCH,
        "system": stint.system,
        "mode": stint.mode,
        "concurrency": concurrency,
        "round": stint.round,
        "error": error,
    }


def _median(values: Iterable[Any]) -> float | None:
    present = [float(v) for v in values if isinstance(v, int | float)]
    return round(statistics.median(present), 3) if present else None


def medians(lines: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``"system/mode"`` → concurrency (as a string: JSON keys) → median of each figure over
    the rounds, with the runs counted and the load average range at their starts."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    keys = {(line["system"], line["mode"], line["concurrency"]) for line in lines}
    for system, mode, c in sorted(keys, key=lambda k: (k[0], k[1], k[2])):
        runs = [
            line
            for line in lines
            if (line["system"], line["mode"], line["concurrency"]) == (system, mode, c)
        ]
        entry: dict[str, Any] = {"runs": len(runs)}
        entry.update({k: _median(line.get(k) for line in runs) for k in FIGURES})
        load = [line["loadavg_start"][0] for line in runs if line.get("loadavg_start")]
        entry["loadavg_1m_start"] = [min(load), max(load)] if load else None
        out.setdefault(f"{system}/{mode}", {})[str(c)] = entry
    return out


def ratios(per_run: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """``system`` → concurrency → disagg median / agg median of each figure (``None`` where
    either is missing or the agg one is 0): below 1 means disaggregation lowered it."""
    out: dict[str, Any] = {}
    systems = {key.split("/", 1)[0] for key in per_run}
    for system in sorted(systems):
        agg, dis = per_run.get(f"{system}/{AGG}", {}), per_run.get(f"{system}/{DISAGG}", {})
        for c in sorted(set(agg) & set(dis), key=int):
            out.setdefault(system, {})[c] = {
                k: round(dis[c][k] / agg[c][k], 3) if dis[c].get(k) and agg[c].get(k) else None
                for k in FIGURES
            }
    return out


def checks(lines: Sequence[Mapping[str, Any]]) -> list[str]:
    """What makes the lines not comparable: errors, short outputs, cache hits (every prompt
    is unique), different prompts for one seed, and disaggregated runs whose probe found no
    prefill worker."""
    problems = []
    by_seed: dict[Any, set[Any]] = {}
    for line in lines:
        where = f"{line['system']} {line['mode']} c={line['concurrency']} round {line['round']}"
        if line.get("errors"):
            problems.append(f"{where}: {line['errors']} errors")
        if line.get("out_tokens_mean") not in (None, line.get("max_tokens")):
            problems.append(f"{where}: out_tokens_mean {line['out_tokens_mean']} != max_tokens")
        if (line.get("kv_hit_rate") or 0.0) > MAX_KV_HIT_RATE:
            problems.append(f"{where}: kv_hit_rate {line['kv_hit_rate']} (prompts are unique)")
        if line["mode"] == DISAGG and line.get("phases") is None:
            problems.append(f"{where}: no prefill worker named by the probe")
        by_seed.setdefault(line.get("seed"), set()).add(line.get("prompts_sha256"))
    problems += [
        f"seed {seed}: prompts differ across systems/modes ({len(digests)} prompts_sha256)"
        for seed, digests in by_seed.items()
        if len(digests - {None}) > 1
    ]
    return problems


def summarize(lines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The last line: medians over the rounds of the runs that measured something, the
    disagg/agg ratios per system, the failed runs counted and ``checks``."""
    measured = [line for line in lines if "error" not in line]
    per_run = medians(measured)
    return {
        "bench": BENCH,
        "summary": "disagg",
        "rounds": max((line["round"] for line in lines), default=0),
        "failed_runs": len(lines) - len(measured),
        "medians": per_run,
        "disagg_over_agg": ratios(per_run),
        "checks": checks(measured),
    }
