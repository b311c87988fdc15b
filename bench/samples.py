"""Per-request latency samples kept in a bench's JSON, so distributions can be drawn later.

Standard library only: ``bench.loadgen_samples`` imports it under the Dynamo kit's python.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MAX_SAMPLES = 500
"""Most values kept per distribution: a CDF drawn from them is within 1/500 of the full one."""


def bounded(values_s: Iterable[float], limit: int = MAX_SAMPLES) -> list[float]:
    """The values in ms (to 0.1 µs: ITL at speedup 0 is a few µs), sorted; above ``limit``
    values, ``limit`` evenly spaced order statistics that keep the minimum and the maximum."""
    ordered = sorted(values_s)
    if len(ordered) > limit > 1:
        last = len(ordered) - 1
        ordered = [ordered[round(i * last / (limit - 1))] for i in range(limit)]
    return [round(v * 1000.0, 4) for v in ordered]


def latency_samples(ttft_s: Iterable[float], itl_s: Iterable[float]) -> dict[str, object]:
    """The ``samples`` entry of a bench record: bounded TTFT and ITL samples (ITL: one value per
    request, its mean gap between tokens after the first) and how many requests they stand for."""
    ttft, itl = list(ttft_s), list(itl_s)
    return {"requests": len(ttft), "ttft_ms": bounded(ttft), "itl_ms": bounded(itl)}


def without_samples(record: Any) -> Any:
    """``record`` as printed: every ``samples`` entry left out, however deep (a bench file keeps
    them; a terminal gets hundreds of numbers a run otherwise)."""
    if isinstance(record, dict):
        return {k: without_samples(v) for k, v in record.items() if k != "samples"}
    return record
