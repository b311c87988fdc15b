"""GPU benchmark of the transformers engine (issues 11, 27): the engine alone, then the whole stack.

1. Writes a model directory: Qwen3-0.6B's published ``config.json`` values (random weights) or,
   with ``--tiny``, a 2-layer toy, plus the bundled Qwen3 tokenizer files (no network).
2. Drives the engine alone: ``HfEngine`` with its core in threads of this process
   (``own_process=False``: transformers' manager and nothing of JetServe's but the stream
   wrapper; no NATS, no engine process), ``stream`` per request, at each concurrency level: a
   fixed number of requests, each a distinct prompt of ``--prompt-len`` token ids and exactly
   ``--max-tokens`` sampled output tokens (``ignore_eos``).
3. Starts the whole stack (embedded nats-server, preprocessor, router, formatter, gateway and one
   ``services.hf_worker``, whose engine runs in its own process, on the same device) and sends
   the same workload as streaming ``/v1/completions`` with token-id prompts: everything
   JetServe adds, the engine process's socket included, is in the difference.
4. Prints output tokens/s and TTFT (p50 / mean) side by side; writes every figure, per request
   too, to ``<out>/results.json`` (``<out>/logs/`` holds the services' logs; the model and
   the JetStream store stay in ``--work-dir``).

Run it with ``bash bench/gpu/run.sh [--tiny --device cpu] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import importlib
import json
import platform
import random
import shlex
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.httpclient import Connection
from services.cli.stack import Stack, StackConfig
from services.hf_worker.engine import HfEngine, HfEngineOptions
from shared.messages import SamplingParams
from shared.model_dir import TINY_QWEN3, ensure_default_model_dir
from shared.worker.records import EngineInput

MODEL_NAME = "Qwen/Qwen3-0.6B-random"
SEED = 11


@dataclass
class Sample:
    """One request's figures."""

    ok: bool
    ttft_s: float | None
    e2e_s: float
    output_tokens: int
    error: str | None = None


def write_model_dir(target: Path, *, tiny: bool) -> Path:
    """Qwen3-0.6B's shapes (or the 2-layer toy) and the bundled tokenizer files."""
    return ensure_default_model_dir(target, TINY_QWEN3 if tiny else None)


def prompts(count: int, length: int) -> list[list[int]]:
    """``count`` distinct prompts of ``length`` ordinary token ids (no specials), seeded."""
    rng = random.Random(SEED)
    return [[rng.randrange(1000, 100000) for _ in range(length)] for _ in range(count)]


def summarize(samples: list[Sample], wall_s: float, concurrency: int) -> dict[str, Any]:
    """Throughput and TTFT of one level (failed requests are counted, not averaged)."""
    ok = [s for s in samples if s.ok]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    tokens = sum(s.output_tokens for s in ok)
    tpots = [  # time per output token after the first
        (s.e2e_s - s.ttft_s) / (s.output_tokens - 1)
        for s in ok
        if s.ttft_s is not None and s.output_tokens > 1
    ]
    return {
        "concurrency": concurrency,
        "requests": len(samples),
        "failed": len(samples) - len(ok),
        "wall_s": round(wall_s, 3),
        "output_tokens": tokens,
        "output_tok_s": round(tokens / wall_s, 1) if wall_s > 0 else 0.0,
        "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 1) if ttfts else None,
        "ttft_mean_ms": round(statistics.fmean(ttfts) * 1000, 1) if ttfts else None,
        "e2e_mean_s": round(statistics.fmean(s.e2e_s for s in ok), 3) if ok else None,
        "tpot_ms_mean": round(statistics.fmean(tpots) * 1000, 2) if tpots else None,
        "errors": sorted({s.error for s in samples if s.error})[:5],
    }


async def closed_loop(
    concurrency: int, count: int, one: Callable[[int], Awaitable[Sample]], deadline: float
) -> tuple[list[Sample], float]:
    """Run ``count`` requests ``concurrency`` at a time, none started after ``deadline``
    (``perf_counter`` time; those in flight finish); ``(samples, wall seconds)``."""
    next_index = 0
    samples: list[Sample] = []

    async def client() -> None:
        nonlocal next_index
        while next_index < count and time.perf_counter() < deadline:
            i = next_index
            next_index += 1
            samples.append(await one(i))

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return samples, time.perf_counter() - t0


# --- in-process engine ----------------------------------------------------------------------------


def engine_options(args: argparse.Namespace, model_dir: Path) -> HfEngineOptions:
    return HfEngineOptions(
        model_dir=model_dir,
        random_weights=True,
        device=args.device,
        dtype=args.dtype,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_batch_tokens=args.max_batch_tokens,
        max_num_seqs=max(args.levels),
        seed=SEED,
        own_process=False,
    )


async def engine_phase(
    args: argparse.Namespace, model_dir: Path, work: list[list[int]], deadline: float
) -> list[dict[str, Any]]:
    engine = HfEngine(engine_options(args, model_dir))
    t0 = time.perf_counter()
    facts = await engine.start()
    print(f"engine: started in {time.perf_counter() - t0:.1f}s, {facts}", flush=True)
    counter = 0

    async def one(prompt: list[int], max_tokens: int) -> Sample:
        nonlocal counter
        counter += 1
        request = EngineInput(
            request_id=f"bench-{counter}",
            token_ids=tuple(prompt),
            sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, ignore_eos=True),
            hash_seed=0,
        )
        t_start = time.perf_counter()
        ttft: float | None = None
        tokens = 0
        try:
            engine.check(request)
            async for emission in engine.stream(request):
                if emission.token_ids and ttft is None:
                    ttft = time.perf_counter() - t_start
                tokens += len(emission.token_ids)
        except Exception as exc:
            await engine.abort(request.request_id)
            return Sample(False, ttft, time.perf_counter() - t_start, tokens, repr(exc)[:200])
        return Sample(True, ttft, time.perf_counter() - t_start, tokens)

    def nth(level_work: list[list[int]], i: int) -> Awaitable[Sample]:
        return one(level_work[i], args.max_tokens)

    results = []
    try:
        await closed_loop(4, 8, lambda i: one(work[i], 16), deadline)  # warm-up, not recorded
        # A first full-length request at c=1 is slow (seen on an H100: 8.7 s, not 3.3 s): warm
        # that shape up too, or c=1's throughput measures it.
        await closed_loop(1, 2, lambda i: one(work[i], args.max_tokens), deadline)
        for level in args.levels:
            count = requests_at(args, level)
            samples, wall = await closed_loop(
                level, count, functools.partial(nth, work[offsets(args)[level] :]), deadline
            )
            summary = summarize(samples, wall, level)
            summary["truncated"] = len(samples) < count
            summary["samples"] = [asdict(s) for s in samples]
            results.append(summary)
            print(f"engine c={level}: {brief(summary)}", flush=True)
    finally:
        await engine.stop()
        release_memory()
    return results


def release_memory() -> None:
    gc.collect()
    torch = importlib.import_module("torch")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- the whole stack over HTTP -----------------------------------------------------------------


def worker_args(args: argparse.Namespace, model_dir: Path) -> list[str]:
    opts = engine_options(args, model_dir)
    return [
        *("--model-path", str(model_dir), "--model-name", MODEL_NAME, "--random-weights"),
        *("--device", opts.device, "--dtype", opts.dtype, "--seed", str(opts.seed)),
        *("--block-size", str(opts.block_size), "--num-blocks", str(opts.num_blocks)),
        *("--max-batch-tokens", str(opts.max_batch_tokens)),
        *("--max-num-seqs", str(opts.max_num_seqs), "--max-waiting", "0"),
        *("--tool-call-parser", "none", "--reasoning-parser", "none"),
    ]


async def http_phase(
    args: argparse.Namespace, model_dir: Path, work: list[list[int]], out: Path, deadline: float
) -> list[dict[str, Any]]:
    config = StackConfig(
        http_port=0,
        grpc_port=0,
        namespace=f"bench{uuid.uuid4().hex[:6]}",
        workers=1,
        engine="hf",
        mocker_args=shlex.join(worker_args(args, model_dir)),
        run_dir=args.work_dir / "stack",
        log_level="INFO",
    )
    stack = Stack(config)
    t0 = time.perf_counter()
    try:
        await asyncio.to_thread(stack.start, ready_timeout_s=args.start_timeout_s)
    except Exception:
        for child in stack.children:
            print(f"--- {child.name}\n{child.tail(30)}", flush=True)
        stack.stop()
        raise
    print(f"stack: ready in {time.perf_counter() - t0:.1f}s at {stack.base_url}", flush=True)
    host, port = stack.config.http_host, stack.http_port
    # One connection per client of the biggest level, and of the warm-up (4 at once).
    connections = [Connection(host, port) for _ in range(max(4, *args.levels))]

    async def one(conn: Connection, prompt: list[int], max_tokens: int) -> Sample:
        body = {
            "model": MODEL_NAME,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for attempt in (1, 2):  # the server may have closed an idle kept-alive connection
            try:
                rec = await conn.post_stream("/v1/completions", body)
                break
            except (OSError, IndexError, ValueError, asyncio.IncompleteReadError) as exc:
                await conn.close()
                if attempt == 2:
                    return Sample(False, None, 0.0, 0, repr(exc)[:200])
        return Sample(rec.ok, rec.ttft_s, rec.e2e_s, rec.completion_tokens, rec.error)

    results = []
    try:
        await level_over_connections(4, 8, connections, work, 16, one, deadline)  # warm-up
        await level_over_connections(1, 2, connections, work, args.max_tokens, one, deadline)
        for level in args.levels:
            count = requests_at(args, level)
            # Client k of a level always uses connection k: one request per connection at a time.
            base = offsets(args)[level]
            samples, wall = await level_over_connections(
                level, count, connections, work[base:], args.max_tokens, one, deadline
            )
            summary = summarize(samples, wall, level)
            summary["truncated"] = len(samples) < count
            summary["samples"] = [asdict(s) for s in samples]
            results.append(summary)
            print(f"http   c={level}: {brief(summary)}", flush=True)
    finally:
        for conn in connections:
            await conn.close()
        await asyncio.to_thread(stack.stop)
        await asyncio.to_thread(keep_logs, stack, out / "logs")
    return results


def keep_logs(stack: Stack, target: Path) -> None:
    """Copy the services' logs (not the JetStream store) next to the figures."""
    target.mkdir(parents=True, exist_ok=True)
    for log in stack.run_dir.glob("*.log"):
        shutil.copyfile(log, target / log.name)


async def level_over_connections(
    concurrency: int,
    count: int,
    connections: list[Connection],
    work: list[list[int]],
    max_tokens: int,
    one: Callable[[Connection, list[int], int], Awaitable[Sample]],
    deadline: float,
) -> tuple[list[Sample], float]:
    """``closed_loop`` where client ``k`` always sends on connection ``k``."""
    next_index = 0
    samples: list[Sample] = []

    async def client(conn: Connection) -> None:
        nonlocal next_index
        while next_index < count and time.perf_counter() < deadline:
            i = next_index
            next_index += 1
            samples.append(await one(conn, work[i], max_tokens))

    t0 = time.perf_counter()
    await asyncio.gather(*(client(connections[k]) for k in range(concurrency)))
    return samples, time.perf_counter() - t0


# --- report -----------------------------------------------------------------------------------


def offsets(args: argparse.Namespace) -> dict[int, int]:
    """Where each level's prompts start in the work list: every request of a run has its own
    prompt (the first 8 are the warm-up's), so no level finds another's blocks cached."""
    result, at = {}, 8
    for level in args.levels:
        result[level] = at
        at += requests_at(args, level)
    return result


def requests_at(args: argparse.Namespace, level: int) -> int:
    """Requests per level: ``--requests`` x the level, at least ``--min-requests``."""
    return max(int(args.min_requests), int(args.requests) * level)


def brief(summary: dict[str, Any]) -> str:
    return (
        f"{summary['output_tok_s']} tok/s, TTFT p50 {summary['ttft_p50_ms']} ms mean "
        f"{summary['ttft_mean_ms']} ms, {summary['requests']} requests "
        f"({summary['failed']} failed) in {summary['wall_s']}s"
        + (" (cut short by --budget-s)" if summary.get("truncated") else "")
    )


def table(engine: list[dict[str, Any]], http: list[dict[str, Any]]) -> str:
    head = (
        f"{'conc':>5} | {'engine tok/s':>12} {'TTFT p50':>9} {'mean':>8} {'TPOT':>6} | "
        f"{'http tok/s':>10} {'TTFT p50':>9} {'mean':>8} {'TPOT':>6} | {'http/engine':>11}"
    )
    lines = [head, "-" * len(head)]
    by_level = {r["concurrency"]: r for r in http}
    for e in engine:
        h = by_level.get(e["concurrency"], {})
        ratio = (
            f"{h['output_tok_s'] / e['output_tok_s']:.2f}"
            if h.get("output_tok_s") and e["output_tok_s"]
            else "-"
        )
        lines.append(
            f"{e['concurrency']:>5} | {e['output_tok_s']:>12} {fmt(e['ttft_p50_ms']):>9} "
            f"{fmt(e['ttft_mean_ms']):>8} {fmt(e.get('tpot_ms_mean')):>6} | "
            f"{fmt(h.get('output_tok_s')):>10} {fmt(h.get('ttft_p50_ms')):>9} "
            f"{fmt(h.get('ttft_mean_ms')):>8} {fmt(h.get('tpot_ms_mean')):>6} | {ratio:>11}"
        )
    lines.append(
        "(TTFT and TPOT, the time per output token after the first, in ms; failed requests are "
        "left out of the averages)"
    )
    return "\n".join(lines)


def fmt(value: object) -> str:
    return "-" if value is None else str(value)


def environment() -> dict[str, Any]:
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": gpu,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("/tmp/jetserve-gpu-bench"))
    p.add_argument(
        "--work-dir",
        type=Path,
        default=Path("/tmp/jetserve-gpu-bench-work"),
        help="the model directory and the stack's JetStream store (kept out of --out)",
    )
    p.add_argument("--tiny", action="store_true", help="a 2-layer toy model (CPU smoke run)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default="auto")
    p.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    p.add_argument(
        "--requests", type=int, default=None, help="requests per level = this x level (2; 1 tiny)"
    )
    p.add_argument("--min-requests", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=None, help="256 (32 with --tiny)")
    p.add_argument("--max-tokens", type=int, default=None, help="128 (16 with --tiny)")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--num-blocks", type=int, default=1024, help="0 = sized from GPU memory")
    p.add_argument(
        "--max-batch-tokens", type=int, default=8192, help="0 = transformers decides from memory"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=240.0,
        help="no request starts later than this after the start (half for the engine phase)",
    )
    p.add_argument("--start-timeout-s", type=float, default=240.0)
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--skip-http", action="store_true")
    return p.parse_args(argv)


def save(out: Path, report: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


async def amain(args: argparse.Namespace, model_dir: Path) -> int:
    out: Path = args.out
    work = prompts(8 + sum(requests_at(args, c) for c in args.levels), args.prompt_len)
    report: dict[str, Any] = {
        "environment": environment(),
        "workload": {
            "model": "tiny" if args.tiny else "Qwen3-0.6B (random weights)",
            "levels": args.levels,
            "requests": {c: requests_at(args, c) for c in args.levels},
            "prompt_len": args.prompt_len,
            "max_tokens": args.max_tokens,
            "block_size": args.block_size,
            "num_blocks": args.num_blocks,
            "device": args.device,
        },
        "engine": [],
        "http": [],
    }
    print(json.dumps(report["environment"]), flush=True)
    started = time.perf_counter()
    failed = False
    for phase in ("engine", "http"):
        if getattr(args, f"skip_{phase}"):
            continue
        try:
            if phase == "engine":
                deadline = started + args.budget_s / (1 if args.skip_http else 2)
                report["engine"] = await engine_phase(args, model_dir, work, deadline)
            else:
                deadline = started + args.budget_s
                report["http"] = await http_phase(args, model_dir, work, out, deadline)
        except Exception as exc:
            failed = True
            report[f"{phase}_error"] = repr(exc)
            print(f"{phase} phase failed: {exc!r}", flush=True)
        save(out, report)
    report["total_s"] = round(time.perf_counter() - started, 1)
    save(out, report)
    print(table(report["engine"], report["http"]), flush=True)
    print(f"total {report['total_s']}s; figures in {out / 'results.json'}", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    tiny = bool(args.tiny)
    if tiny and args.device == "auto":
        args.device = "cpu"
    # A CPU smoke run checks the code path: transformers' per-request sampling processors sort
    # the whole 151,936-token vocabulary per token, which a CPU does slowly.
    args.requests = args.requests if args.requests is not None else (1 if tiny else 2)
    args.prompt_len = args.prompt_len if args.prompt_len is not None else (32 if tiny else 256)
    args.max_tokens = args.max_tokens if args.max_tokens is not None else (16 if tiny else 128)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.work_dir / "stack").mkdir(parents=True, exist_ok=True)
    model_dir = write_model_dir(args.work_dir / "model", tiny=args.tiny)
    sys.exit(asyncio.run(amain(args, model_dir)))


if __name__ == "__main__":
    main()
