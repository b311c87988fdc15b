"""Serving benchmark: start a local stack (speedup 0), drive it at concurrency 1 and 64, print JSON.

    python -m bench.serving [--workloads a b] [--router-mode round-robin] [--url URL --pids n=pid]

(a) c=1, 200 requests, 32 output tokens; (b) c=64, 2000 requests, 64 output tokens; chat,
streaming, ``ignore_eos`` so every request yields exactly ``max_tokens``. CPU per request is
read from /proc for every process of the stack and for this client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import time
from pathlib import Path
from urllib.parse import urlparse

from bench.httpclient import Connection, Record
from services.cli.stack import Stack, StackConfig
from shared.model_dir import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model_dir

WORKLOADS = {
    "a": {"concurrency": 1, "requests": 200, "max_tokens": 32, "prompt_words": 32},
    "b": {"concurrency": 64, "requests": 2000, "max_tokens": 64, "prompt_words": 32},
}
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "an",
    "which",
    "are",
    "this",
    "be",
    "had",
    "river",
    "stone",
    "light",
    "garden",
    "window",
    "morning",
    "city",
    "music",
    "paper",
    "winter",
    "market",
    "station",
    "bridge",
]
CLK = os.sysconf("SC_CLK_TCK")


def prompts(n: int, words: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and its live descendants, in seconds."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK
    return total


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            out += [kid, *_children(kid)]
    return out


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


async def warm_up(url: str, model: str) -> None:
    """Five unmeasured requests: the first one loads the tokenizers in the services."""
    target = urlparse(url)
    warm = Connection(target.hostname or "127.0.0.1", target.port or 80)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "warm up"}],
        "max_tokens": 4,
        "stream": True,
    }
    for _ in range(5):
        await warm.post_stream("/v1/chat/completions", body)
    await warm.close()


async def run_workload(url: str, model: str, spec: dict[str, int]) -> tuple[list[Record], float]:
    """One user turn of ``prompt_words`` random words per request."""
    texts = prompts(spec["requests"], spec["prompt_words"])
    chats = [[{"role": "user", "content": t}] for t in texts]
    return await run_chats(url, model, chats, spec["concurrency"], spec["max_tokens"])


async def run_chats(
    url: str, model: str, chats: list[list[dict[str, str]]], concurrency: int, max_tokens: int
) -> tuple[list[Record], float]:
    """Send every chat (streaming, ``ignore_eos``) from ``concurrency`` kept-alive connections."""
    target = urlparse(url)
    queue: asyncio.Queue[list[dict[str, str]]] = asyncio.Queue()
    for chat in chats:
        queue.put_nowait(chat)
    records: list[Record] = []

    async def worker() -> None:
        conn = Connection(target.hostname or "127.0.0.1", target.port or 80)
        try:
            while not queue.empty():
                body = {
                    "model": model,
                    "messages": queue.get_nowait(),
                    "max_tokens": max_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "temperature": 0.0,
                    "ignore_eos": True,
                }
                try:
                    records.append(await conn.post_stream("/v1/chat/completions", body))
                except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
                    records.append(Record(error=repr(exc)))
                    await conn.close()
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records, time.perf_counter() - started


def summarize(
    name: str, spec: dict[str, int], records: list[Record], wall: float, cpu: dict[str, float]
) -> dict[str, object]:
    ok = [r for r in records if r.ok]
    ms = 1000.0
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [(r.e2e_s - (r.ttft_s or 0)) / max(1, r.completion_tokens - 1) for r in ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    n = max(1, len(ok))
    return {
        "workload": name,
        **spec,
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "first_error": next((r.error for r in records if not r.ok), None),
        "wall_s": round(wall, 3),
        "req_per_s": round(len(ok) / wall, 1),
        "out_tok_per_s": round(out_tokens / wall, 1),
        "out_tokens_mean": round(out_tokens / n, 1),
        "prompt_tokens_mean": round(sum(r.prompt_tokens for r in ok) / n, 1),
        "ttft_ms_p50": round(pct(ttft, 50) * ms, 3),
        "ttft_ms_p99": round(pct(ttft, 99) * ms, 3),
        "itl_ms_p50": round(pct(itl, 50) * ms, 3),
        "itl_ms_p99": round(pct(itl, 99) * ms, 3),
        "e2e_ms_p50": round(pct([r.e2e_s for r in ok], 50) * ms, 3),
        "e2e_ms_p99": round(pct([r.e2e_s for r in ok], 99) * ms, 3),
        "cpu_ms_per_req": {k: round(v * ms / n, 3) for k, v in cpu.items()},
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def _client_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def bench(url: str, model: str, pids: dict[str, int], names: list[str]) -> None:
    await warm_up(url, model)
    for name in names:
        spec = WORKLOADS[name]
        before = {k: cpu_s(p) for k, p in pids.items()}
        client_before = _client_cpu()
        records, wall = await run_workload(url, model, spec)
        cpu = {k: cpu_s(p) - before[k] for k, p in pids.items()}
        cpu["loadgen"] = _client_cpu() - client_before
        cpu["total"] = sum(cpu.values())
        print(json.dumps(summarize(name, spec, records, wall, cpu)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__)
    parser.add_argument("--workloads", nargs="+", default=["a", "b"], choices=sorted(WORKLOADS))
    parser.add_argument("--router-mode", default="round-robin")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--url", default="", help="bench a running server instead")
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME)
    parser.add_argument("--pids", nargs="*", default=[], help="name=pid pairs to charge CPU to")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    names = [w for w in args.workloads for _ in range(args.repeat)]
    if args.url:
        pids = {k: int(v) for k, v in (p.split("=", 1) for p in args.pids)}
        asyncio.run(bench(args.url, args.model, pids, names))
        return
    model_dir = ensure_default_model_dir(default_model_dir())
    stack = Stack(
        StackConfig(
            http_port=0,
            workers=args.workers,
            router_mode=args.router_mode,
            model_path=str(model_dir),
            model_name=args.model,
            mocker_args="--speedup-ratio 0",
            log_level="WARNING",
            namespace=f"bench{os.getpid()}",
        )
    )
    stack.start()
    try:
        pids = {name: pid for name, pid in stack.pids().items()}
        asyncio.run(bench(stack.base_url, args.model, pids, names))
    finally:
        stack.stop()
        stack.remove_run_dir()


if __name__ == "__main__":
    main()
