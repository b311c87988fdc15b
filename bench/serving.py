"""Serving benchmark: start a local stack (speedup 0), drive it at concurrency 1 and 64, print JSON.

    python -m bench.serving [--workloads a b] [--protocols http grpc grpc-grpcio] [--http-api ...]
                            [--router-mode round-robin] [--url URL --grpc HOST:PORT --pids n=pid]
                            [--dynamo auto|on|off] [--rounds 3] [--out FILE]

(a) c=1, 200 requests, 32 output tokens; (b) c=64, 2000 requests, 64 output tokens; streaming,
``ignore_eos`` so every request yields exactly ``max_tokens``. Each workload runs once per
protocol, alternating on the same stack: HTTP (``/v1/completions``, or chat with ``--http-api
chat``; kept-alive connections) and KServe gRPC (``ModelStreamInfer``, one stream per client,
requests one after another on it) from two clients: ``grpc`` is grpclib's (asyncio, no threads,
as the raw HTTP client), ``grpc-grpcio`` the stock one (grpc core, what Triton users run); the
same prompts, one JSON line each with ``"protocol"``.
CPU per request is read from /proc for every process of the stack and for this client. Each line
keeps its requests' TTFT and ITL (``samples``, bounded: ``bench.samples``); with ``--out`` the
lines are appended to FILE too, and the plots of FILE (``bench.plots``) drawn next to it.

Then (not with ``--url``), unless ``--dynamo off``: ``bench.side_by_side``, workload (a) with
the kit's own client, Dynamo and JetServe alternated for ``--rounds`` (JetServe alone, after one
line saying so, where the Dynamo reference bench kit is not installed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import time
from pathlib import Path
from typing import TextIO
from urllib.parse import urlparse

from bench import plots, side_by_side
from bench.grpcclient import CLIENTS, LoopStreamClient
from bench.httpclient import Connection, Record
from bench.samples import latency_samples
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
PROTOCOLS = ("http", "grpc", "grpc-grpcio")
HTTP_APIS = ("completions", "chat")


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


async def warm_up(url: str, model: str, grpc_target: str = "") -> None:
    """Unmeasured requests: the first ones load the tokenizers and the gRPC model view."""
    target = urlparse(url)
    warm = Connection(target.hostname or "127.0.0.1", target.port or 80)
    chat = {"messages": [{"role": "user", "content": "warm up"}]}
    for extra, path in ((chat, "/v1/chat/completions"), ({"prompt": "warm up"}, "/v1/completions")):
        body = {"model": model, "max_tokens": 4, "stream": True, **extra}
        for _ in range(5):
            await warm.post_stream(path, body)
    await warm.close()
    if grpc_target:
        stream = LoopStreamClient(grpc_target)
        for _ in range(5):
            await stream.infer(model, "warm up", 4)
        await stream.close()


async def run_workload(
    url: str,
    model: str,
    spec: dict[str, int],
    *,
    protocol: str = "http",
    http_api: str = "chat",
    grpc_target: str = "",
) -> tuple[list[Record], float]:
    """One request of ``prompt_words`` random words per prompt, over ``protocol``."""
    texts = prompts(spec["requests"], spec["prompt_words"])
    concurrency, max_tokens = spec["concurrency"], spec["max_tokens"]
    if protocol in CLIENTS:
        return await run_grpc(grpc_target, model, texts, concurrency, max_tokens, protocol)
    if http_api == "completions":
        return await run_completions(url, model, texts, concurrency, max_tokens)
    chats = [[{"role": "user", "content": t}] for t in texts]
    return await run_chats(url, model, chats, concurrency, max_tokens)


async def run_chats(
    url: str, model: str, chats: list[list[dict[str, str]]], concurrency: int, max_tokens: int
) -> tuple[list[Record], float]:
    """Send every chat (streaming, ``ignore_eos``) from ``concurrency`` kept-alive connections."""
    bodies: list[dict[str, object]] = [{"model": model, "messages": chat} for chat in chats]
    return await _run_http(url, "/v1/chat/completions", bodies, concurrency, max_tokens)


async def run_completions(
    url: str, model: str, texts: list[str], concurrency: int, max_tokens: int
) -> tuple[list[Record], float]:
    """Send every prompt to ``/v1/completions`` (streaming, ``ignore_eos``), as ``run_chats``."""
    bodies: list[dict[str, object]] = [{"model": model, "prompt": text} for text in texts]
    return await _run_http(url, "/v1/completions", bodies, concurrency, max_tokens)


async def _run_http(
    url: str, path: str, bodies: list[dict[str, object]], concurrency: int, max_tokens: int
) -> tuple[list[Record], float]:
    target = urlparse(url)
    queue: asyncio.Queue[dict[str, object]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    records: list[Record] = []

    async def worker() -> None:
        conn = Connection(target.hostname or "127.0.0.1", target.port or 80)
        try:
            while not queue.empty():
                body = {
                    **queue.get_nowait(),
                    "max_tokens": max_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "temperature": 0.0,
                    "ignore_eos": True,
                }
                try:
                    records.append(await conn.post_stream(path, body))
                except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
                    records.append(Record(error=repr(exc)))
                    await conn.close()
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records, time.perf_counter() - started


async def run_grpc(
    grpc_target: str,
    model: str,
    texts: list[str],
    concurrency: int,
    max_tokens: int,
    protocol: str = "grpc",
) -> tuple[list[Record], float]:
    """Send every prompt over ``ModelStreamInfer``: ``concurrency`` clients (of the protocol's
    client class), one stream each."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for text in texts:
        queue.put_nowait(text)
    records: list[Record] = []

    async def worker() -> None:
        stream = CLIENTS[protocol](grpc_target)
        try:
            while not queue.empty():
                records.append(await stream.infer(model, queue.get_nowait(), max_tokens))
        finally:
            await stream.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records, time.perf_counter() - started


def summarize(
    name: str,
    spec: dict[str, int],
    records: list[Record],
    wall: float,
    cpu: dict[str, float],
    labels: dict[str, str] | None = None,
) -> dict[str, object]:
    ok = [r for r in records if r.ok]
    ms = 1000.0
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [(r.e2e_s - (r.ttft_s or 0)) / max(1, r.completion_tokens - 1) for r in ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    n = max(1, len(ok))
    return {
        "workload": name,
        **(labels or {}),
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
        "samples": latency_samples(ttft, itl),
    }


def _client_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def bench(
    url: str,
    model: str,
    pids: dict[str, int],
    names: list[str],
    *,
    protocols: list[str],
    http_api: str,
    grpc_target: str,
    out: TextIO | None = None,
) -> None:
    """Each workload once per protocol, alternating, each charged the CPU it used."""
    await warm_up(url, model, grpc_target if set(protocols) & set(CLIENTS) else "")
    for name in names:
        spec = WORKLOADS[name]
        for protocol in protocols:
            before = {k: cpu_s(p) for k, p in pids.items()}
            client_before = _client_cpu()
            records, wall = await run_workload(
                url, model, spec, protocol=protocol, http_api=http_api, grpc_target=grpc_target
            )
            cpu = {k: cpu_s(p) - before[k] for k, p in pids.items()}
            cpu["loadgen"] = _client_cpu() - client_before
            cpu["total"] = sum(cpu.values())
            labels = {"protocol": protocol, "api": http_api if protocol == "http" else "kserve"}
            if protocol in CLIENTS:
                labels["client"] = CLIENTS[protocol].__name__
            side_by_side.emit(summarize(name, spec, records, wall, cpu, labels), out)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__)
    parser.add_argument("--workloads", nargs="+", default=["a", "b"], choices=sorted(WORKLOADS))
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    parser.add_argument(
        "--http-api",
        default="completions",
        choices=HTTP_APIS,
        help="HTTP endpoint: completions (the same prompt text as gRPC's text_input) or chat",
    )
    parser.add_argument("--router-mode", default="round-robin")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--url", default="", help="bench a running server instead")
    parser.add_argument("--grpc", default="", help="its gRPC host:port (with --url)")
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME)
    parser.add_argument("--pids", nargs="*", default=[], help="name=pid pairs to charge CPU to")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also append the JSON lines to FILE; plots beside")
    side_by_side.add_options(parser)
    args = parser.parse_args()
    code = run(parser, args)
    if args.out:
        plots.report(args.out)
    if code:
        raise SystemExit(code)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The workloads on a running server (``--url``) or a fresh local stack, then (without
    ``--url``) the c=1 side by side; its exit status."""
    names = [w for w in args.workloads for _ in range(args.repeat)]
    options = {"protocols": args.protocols, "http_api": args.http_api}
    if args.url:
        if set(args.protocols) & set(CLIENTS) and not args.grpc:
            parser.error("--url with the grpc protocol needs --grpc HOST:PORT")
        pids = {k: int(v) for k, v in (p.split("=", 1) for p in args.pids)}
        with side_by_side.appending(args.out) as out:
            asyncio.run(
                bench(args.url, args.model, pids, names, grpc_target=args.grpc, out=out, **options)
            )
        return 0
    model_dir = ensure_default_model_dir(default_model_dir())
    stack = Stack(
        StackConfig(
            http_port=0,
            grpc_port=0,
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
        with side_by_side.appending(args.out) as out:
            asyncio.run(
                bench(
                    stack.base_url,
                    args.model,
                    pids,
                    names,
                    grpc_target=stack.grpc_address,
                    out=out,
                    **options,
                )
            )
    finally:
        stack.stop()
        stack.remove_run_dir()
    if args.dynamo == "off":
        return 0
    # Its lines go to the same file; the plots are drawn once, by main, over all of them.
    out_args = ["--out", str(args.out), "--no-plots"] if args.out else []
    return side_by_side.main(["--dynamo", args.dynamo, "--rounds", str(args.rounds), *out_args])


if __name__ == "__main__":
    main()
