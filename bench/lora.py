"""``make bench-lora``: LoRA adapter placement vs routing to static holders (decision 031).

4 mocker workers (``--max-loras 2``, speedup 1), 8 adapters, Zipf demand. Each arm starts a stack
as a user does (``jetserve up --lora-modules …``: every worker holds every adapter), then uses
vLLM's ``/v1/unload_lora_adapter`` to leave each worker the two adapters of a static layout
(adapter i on worker i % 4). ``static`` runs with ``--no-router-lora-placement``: requests go
to those holders only. ``placement`` runs with the router's placement on: it loads hot adapters
on more workers and drops cold copies. Same seeded request sequence in both arms, arms
alternated, ``--rounds`` rounds; served tok/s and TTFT p99 per run, a table, and JSON under
``.bench/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import nats

from bench.fairness_stacks import started
from bench.lora_report import Sample, draw, static_layout, summary, table, zipf_weights
from bench.side_by_side import ROOT, _wait_up_line
from services.cli import runrecord
from shared import codec
from shared.messages import WorkerCard
from shared.model_dir import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model_dir
from shared.registry.jetstream import bucket_entries
from shared.subjects import Subjects

ADAPTERS = [f"lora{i}" for i in range(8)]
WORKERS = 4
ARMS = ("static", "placement")


def jetserve_argv(run_dir: Path, model_dir: Path, arm: str, args: argparse.Namespace) -> list[str]:
    """``jetserve up`` with every adapter on every worker; the arm's router setting."""
    script = Path(sys.executable).with_name("jetserve")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "services.cli"]
    placement = "--router-lora-placement" if arm == "placement" else "--no-router-lora-placement"
    modules = [f"{a}=/adapters/{a}" for a in ADAPTERS]
    return [
        *launcher, "up", "--http-port", "0", "--grpc-port", "0", "--workers", str(WORKERS),
        "--embedders", "0", "--router-mode", "kv", "--model-path", str(model_dir),
        "--model-name", DEFAULT_MODEL_NAME, "--log-level", args.log_level,
        "--run-dir", str(run_dir),
        "--lora-modules", *modules, "--mocker-max-loras", "2",
        "--mocker-speedup-ratio", f"{args.speedup:g}",
        "--mocker-lora-load-time-s", f"{args.load_time_s:g}",
        "--mocker-max-num-seqs", str(args.max_num_seqs),
        placement, "--router-lora-placement-interval-s", "0.5", "--router-lora-cooldown-s", "2",
    ]  # fmt: skip


async def _worker_ids(run_dir: Path) -> list[str]:
    """The stack's worker ids, from the registry (``jetserve up``'s run record names it)."""
    record = runrecord.read(run_dir)
    nc = await nats.connect(record.nats_url)
    try:
        entries = await bucket_entries(nc.jetstream(), Subjects(record.namespace).workers_bucket)
        return sorted(codec.decode(e.value or b"", WorkerCard).worker_id for e in entries)
    finally:
        await nc.close()


async def _layout(base: str, run_dir: Path) -> None:
    """Unload every adapter but the static layout's from each worker (vLLM's endpoint)."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        for _ in range(300):
            models = (await http.get("/v1/models")).json()["data"]
            first = next((m for m in models if m["id"] == ADAPTERS[0]), None)
            if first and first["jetserve"]["workers"]["both"] == WORKERS:
                break
            await asyncio.sleep(0.1)
        ids = await _worker_ids(run_dir)
        if len(ids) != WORKERS:
            raise RuntimeError(f"found workers {ids}, expected {WORKERS}")
        layout = list(zip(static_layout(ADAPTERS, WORKERS), ids, strict=True))
        # With placement on, its placer drops cold copies meanwhile: unloads may find an adapter
        # gone (404, fine); the loads after them put every worker's own two back (idempotent).
        for keep, worker in layout:
            for adapter in ADAPTERS:
                if adapter not in keep:
                    body = {"lora_name": adapter, "worker_ids": [worker]}
                    resp = await http.post("/v1/unload_lora_adapter", json=body)
                    if resp.status_code not in (200, 404):
                        raise RuntimeError(f"unload {adapter} from {worker}: {resp.text}")
        for keep, worker in layout:
            for adapter in keep:
                body = {"lora_name": adapter, "lora_path": f"/adapters/{adapter}"}
                resp = await http.post(
                    "/v1/load_lora_adapter", json={**body, "worker_ids": [worker]}
                )
                if resp.status_code not in (200, 400):  # 400: still held
                    raise RuntimeError(f"load {adapter} on {worker}: {resp.text}")


async def _drive(base: str, sequence: list[str], concurrency: int, max_tokens: int) -> list[Sample]:
    """``sequence`` of adapter requests, ``concurrency`` at a time, streamed (TTFT measured)."""
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for item in enumerate(sequence):
        queue.put_nowait(item)
    samples: list[Sample] = []

    async def worker(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i, adapter = queue.get_nowait()
            body = {
                "model": adapter,
                "messages": [{"role": "user", "content": f"request {i} for {adapter}"}],
                "max_tokens": max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            start = time.perf_counter()
            first: float | None = None
            tokens = 0
            try:
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    ok = r.status_code == 200
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if first is None and chunk.get("choices"):
                            first = time.perf_counter() - start
                        usage = chunk.get("usage")
                        if usage:
                            tokens = int(usage.get("completion_tokens", 0))
            except httpx.HTTPError:
                ok = False
            samples.append(Sample(adapter, first or 0.0, tokens, ok and first is not None))

    async with httpx.AsyncClient(base_url=base, timeout=300) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return samples


def run_arm(arm: str, round_no: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One stack, one arm: layout, warm-up, then the measured sequence."""
    model_dir = ensure_default_model_dir(default_model_dir())
    run_dir = work / f"{arm}-{round_no}"
    run_dir.mkdir(parents=True)
    log = run_dir / "up.log"
    weights = zipf_weights(len(ADAPTERS), args.zipf_s)
    sequence = draw(ADAPTERS, weights, args.requests, seed=args.seed + round_no)
    with started(jetserve_argv(run_dir, model_dir, arm, args), log) as proc:
        base = _wait_up_line(proc, log)
        asyncio.run(_layout(base, run_dir))
        warm = draw(ADAPTERS, weights, args.warmup, seed=10_000 + round_no)
        asyncio.run(_drive(base, warm, args.concurrency, args.max_tokens))
        started_at = time.perf_counter()
        samples = asyncio.run(_drive(base, sequence, args.concurrency, args.max_tokens))
        elapsed = time.perf_counter() - started_at
    return {"arm": arm, "round": round_no, **summary(samples, elapsed), "elapsed_s": elapsed}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.lora", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=600, help="measured requests per run")
    parser.add_argument("--warmup", type=int, default=200, help="requests before measuring")
    parser.add_argument("--concurrency", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--zipf-s", type=float, default=1.0)
    parser.add_argument("--speedup", type=float, default=1.0, help="mocker --speedup-ratio")
    parser.add_argument("--load-time-s", type=float, default=0.2, help="mocker adapter load time")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="mocker batch size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="1 round, 200 requests, warm-up 80")
    parser.add_argument("--arms", default=",".join(ARMS), help="which arms, comma-separated")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default .bench/…)")
    parser.add_argument("--log-level", default="WARNING", help="the stacks' log level")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the stacks' logs here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.requests, args.warmup = 1, 200, 80
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = (
        args.out
        or ROOT / ".bench" / f"{time.strftime('%Y-%m-%dT%H%M%SZ', time.gmtime())}-lora.json"
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        work = args.work_dir or Path(tmp)
        for round_no in range(args.rounds):
            chosen = tuple(a for a in ARMS if a in args.arms.split(","))
            arms = chosen if round_no % 2 == 0 else tuple(reversed(chosen))  # alternated
            for arm in arms:
                rows.append(run_arm(arm, round_no, args, work))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    out.write_text(json.dumps({"settings": settings, "adapters": ADAPTERS, "runs": rows}, indent=1))
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
