"""``make bench-lora``'s pure parts: the Zipf demand, the static layout, per-request records
summed into figures, and the table."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sample:
    """One request: its adapter, when its first token came, how many tokens, and whether it
    failed."""

    adapter: str
    ttft_s: float
    tokens: int
    ok: bool = True


def zipf_weights(count: int, s: float) -> list[float]:
    """Normalized Zipf weights ``1 / k**s`` for ranks 1..count."""
    raw = [1.0 / (k**s) for k in range(1, count + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def draw(adapters: Sequence[str], weights: Sequence[float], n: int, seed: int) -> list[str]:
    """``n`` adapters drawn by ``weights`` (seeded: both arms get the same sequence)."""
    rng = random.Random(seed)
    return rng.choices(list(adapters), weights=list(weights), k=n)


def static_layout(adapters: Sequence[str], workers: int) -> list[list[str]]:
    """Adapter ``i`` on worker ``i % workers`` (each worker holds ``len/workers`` of them)."""
    return [[a for i, a in enumerate(adapters) if i % workers == w] for w in range(workers)]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1), nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[index]


def summary(samples: Sequence[Sample], elapsed_s: float) -> dict[str, float]:
    """Served tok/s, TTFT p50/p99 (ms) and failures of one run."""
    ok = [s for s in samples if s.ok]
    ttfts = [s.ttft_s * 1000 for s in ok]
    return {
        "requests": len(samples),
        "failed": len(samples) - len(ok),
        "tok_s": sum(s.tokens for s in ok) / elapsed_s if elapsed_s > 0 else 0.0,
        "ttft_p50_ms": percentile(ttfts, 0.50),
        "ttft_p99_ms": percentile(ttfts, 0.99),
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The printed table: one line per (arm, round)."""
    head = (
        f"{'arm':<10} {'round':>5} {'req':>5} {'fail':>4} {'tok/s':>8} {'TTFT p50':>9} {'p99':>9}"
    )
    lines = [head, "-" * len(head)]
    lines.extend(
        f"{r['arm']!s:<10} {r['round']!s:>5} {r['requests']!s:>5} {r['failed']!s:>4} "
        f"{float(r['tok_s']):>8.1f} {float(r['ttft_p50_ms']):>7.0f}ms "
        f"{float(r['ttft_p99_ms']):>7.0f}ms"
        for r in rows
    )
    return "\n".join(lines)
