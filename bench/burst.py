"""Overload benchmark: the gateway's memory and answers at steady load and under a 10x burst.

    python -m bench.burst [--concurrency 64] [--burst-factor 10] [--limits 128 0]
                          [--steady-requests 640] [--max-tokens 64] [--speedup-ratio 4]

For each ``--limits`` value (the gateway's ``--max-concurrent-requests``; 0 = none) a fresh
local stack as ``jetserve up`` starts it (private nats-server, every service, two mockers at
``--speedup-ratio``) is driven over HTTP: streaming ``/v1/chat/completions`` with ``ignore_eos``
(every answer is ``--max-tokens`` tokens), one kept-alive connection per client
(``bench.httpclient``), no retries. Phases: ``steady`` (c = N, ``--steady-requests`` requests),
``burst`` (c = 10N, one request per client, all at once), ``after`` (c = N again). One JSON line
per phase: the gateway's RSS in MiB (``VmRSS`` of the pid in the run dir's ``gateway.pid``,
sampled every 20 ms: at the start, the peak, at the end; ``VmHWM``), requests ``ok`` / ``503`` /
``other``, the gateway's own refusals (``jetserve_gateway_rejected_total``), p50/p99 of the
end-to-end latency and TTFT of the ok ones and of the latency of the 503s, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from bench.httpclient import Connection, Record
from bench.serving import pct, prompts
from services.cli.stack import Stack, StackConfig
from shared.model_dir import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model_dir

SAMPLE_S = 0.02
PATH = "/v1/chat/completions"
REJECTED = 'jetserve_gateway_rejected_total{reason="overloaded"}'


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` line of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class RssSampler:
    """The RSS of ``pid`` every ``SAMPLE_S`` while running: first, peak and last, in MiB."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.first = self.peak = self.last = 0.0
        self._task: asyncio.Task[None] | None = None

    def _read(self) -> float:
        mib = status_kib(self.pid, "VmRSS") / 1024
        self.peak = max(self.peak, mib)
        self.last = mib
        return mib

    async def _run(self) -> None:
        while True:
            self._read()
            await asyncio.sleep(SAMPLE_S)

    def start(self) -> None:
        self.first = self.peak = self._read()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._read()


def rejected_total(url: str) -> float:
    """The gateway's refusals so far, from its ``/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        for row in response.read().decode().splitlines():
            key, _, value = row.rpartition(" ")
            if key == REJECTED:
                return float(value)
    return 0.0


async def run_clients(
    url: str, model: str, texts: list[str], clients: int, max_tokens: int
) -> tuple[list[Record], float]:
    """``clients`` connections share ``texts`` (one request at a time each); each connects
    when it sends its first request, so a burst is also a burst of new connections."""
    target = urlparse(url)
    queue: asyncio.Queue[str] = asyncio.Queue()
    for text in texts:
        queue.put_nowait(text)
    records: list[Record] = []

    async def client() -> None:
        conn = Connection(target.hostname or "127.0.0.1", target.port or 80)
        try:
            while not queue.empty():
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": queue.get_nowait()}],
                    "max_tokens": max_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "temperature": 0.0,
                    "ignore_eos": True,
                }
                started = time.perf_counter()
                try:
                    record = await conn.post_stream(PATH, body)
                except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
                    record = Record(error=repr(exc))
                    await conn.close()
                record.e2e_s = time.perf_counter() - started
                records.append(record)
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return records, time.perf_counter() - started


def summarize(
    phase: str,
    limit: int,
    clients: int,
    records: list[Record],
    wall_s: float,
    rss: RssSampler,
    rejected: float,
) -> dict[str, object]:
    ok = [r for r in records if r.ok]
    refused = [r for r in records if r.status == 503]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    return {
        "phase": phase,
        "max_concurrent_requests": limit,
        "clients": clients,
        "requests": len(records),
        "ok": len(ok),
        "503": len(refused),
        "other": len(records) - len(ok) - len(refused),
        "first_other": next((r.error for r in records if not r.ok and r.status != 503), None),
        "gateway_rejected": int(rejected),
        "wall_s": round(wall_s, 3),
        "rss_mib_start": round(rss.first, 1),
        "rss_mib_peak": round(rss.peak, 1),
        "rss_mib_end": round(rss.last, 1),
        "hwm_mib": round(status_kib(rss.pid, "VmHWM") / 1024, 1),
        "e2e_ms_p50": _ms([r.e2e_s for r in ok], 50),
        "e2e_ms_p99": _ms([r.e2e_s for r in ok], 99),
        "ttft_ms_p50": _ms(ttft, 50),
        "ttft_ms_p99": _ms(ttft, 99),
        "refused_ms_p50": _ms([r.e2e_s for r in refused], 50),
        "refused_ms_p99": _ms([r.e2e_s for r in refused], 99),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def _ms(values_s: list[float], p: float) -> float | None:
    """The ``p``th percentile in ms (``None`` when there is nothing to rank)."""
    return round(pct(values_s, p) * 1000, 1) if values_s else None


async def bench(url: str, model: str, pid: int, limit: int, args: argparse.Namespace) -> None:
    """Warm up, then steady, burst, and steady again; one JSON line each."""
    n = args.concurrency
    burst = n * args.burst_factor
    await run_clients(url, model, prompts(8, 8, seed=1), 4, 4)  # tokenizers, first routes
    phases = (
        ("steady", n, prompts(args.steady_requests, args.prompt_words, seed=2)),
        ("burst", burst, prompts(burst, args.prompt_words, seed=3)),
        ("after", n, prompts(args.steady_requests, args.prompt_words, seed=4)),
    )
    for phase, clients, texts in phases:
        before = rejected_total(url)
        rss = RssSampler(pid)
        rss.start()
        records, wall_s = await run_clients(url, model, texts, clients, args.max_tokens)
        await rss.stop()
        rejected = rejected_total(url) - before
        line = summarize(phase, limit, clients, records, wall_s, rss, rejected)
        print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=64, help="N: clients at steady load")
    parser.add_argument("--burst-factor", type=int, default=10, help="the burst is N times this")
    parser.add_argument(
        "--limits",
        type=int,
        nargs="+",
        default=[128, 0],
        help="--max-concurrent-requests of the gateway, one stack each (0 = no limit)",
    )
    parser.add_argument("--steady-requests", type=int, default=640)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--speedup-ratio", type=float, default=4.0, help="the mockers' (0 = none)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME)
    args = parser.parse_args()
    model_dir = ensure_default_model_dir(default_model_dir())
    for limit in args.limits:
        stack = Stack(
            StackConfig(
                http_port=0,
                grpc_port=0,
                workers=args.workers,
                model_path=str(model_dir),
                model_name=args.model,
                mocker_args=f"--speedup-ratio {args.speedup_ratio}",
                log_level="WARNING",
                namespace=f"burst{os.getpid()}",
                service_args={"gateway": ["--max-concurrent-requests", str(limit)]},
            )
        )
        stack.start()
        try:
            pid = int((stack.run_dir / "gateway.pid").read_text())
            asyncio.run(bench(stack.base_url, args.model, pid, limit, args))
        finally:
            stack.stop()
            stack.remove_run_dir()


if __name__ == "__main__":
    main()
