"""Routing benchmark (``make bench-routing``): prints one JSON object.

    python -m bench.routing [--part a] [--workers 16 256 1024] [--events 10000] [--iters 1000]
                            [--out FILE]

(a) In-process and pure, like the Dynamo bench kit's ``radix_bench.py`` for its ``RadixTree``:
    64 base sequences of 8192 random tokens; 10,000 ``BlockStored`` batches, each extending one
    of 16 workers' cached chain on one base sequence by 16 blocks (with ``parent_hash``), are
    applied through ``KvSync`` (msgpack decode + apply, and apply alone: events/s). Then the
    router's decision latency (``RoutingCore.decide``: index lookup, costs, selection; the block
    hashes come with the request from the preprocessor, as in service) is measured for 1k- and
    8k-token prompts that hit a cached prefix and for misses, with 64 requests active, plus a
    hit hashed in the router (``_hashed_here``) and the parts (hashing, ``find_matches``), and
    the registry's live-worker list of the model (``LiveWorkers.for_model``), for each
    ``--workers`` fleet size.
(b) ``--part b``: the shared-prefix serving workload on a local stack (4 mockers at speedup 1,
    1024 blocks of 16): KV hit rate, TTFT p50/p99 and requests/s for each ``--modes``.

With ``--out`` the object is written to FILE, with part (b)'s per-request TTFT and ITL
(``samples``; left out of what is printed), and its plots (``bench.plots``: hit rate and TTFT
by mode, decision latency by fleet size) drawn beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from bench import plots
from bench.samples import without_samples
from bench.serving import WORDS, cpu_s, run_chats, summarize, warm_up
from services.cli.stack import Stack, StackConfig
from services.router.core import CoreSettings, RoutingCore
from services.router.sync import KvSync
from shared import codec
from shared.hashing import prefix_hashes
from shared.messages import BlockStored, Generate, KvEventBatch, SamplingParams, WorkerCard
from shared.model_dir import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model_dir
from shared.registry.reader import LiveWorkers

BLOCK = 16
SEQ_TOKENS = 8192
MODEL = "bench-model"


def _events(
    rng: random.Random, bases: list[list[int]], workers: int, count: int, per_event: int
) -> list[KvEventBatch]:
    """``count`` batches, each extending a (worker, base) chain by ``per_event`` blocks."""
    nblocks = SEQ_TOKENS // BLOCK
    depth: dict[tuple[int, int], int] = {}
    next_id = [1] * workers
    out: list[KvEventBatch] = []
    while len(out) < count:
        w, s = rng.randrange(workers), rng.randrange(len(bases))
        d = depth.get((w, s), 0)
        if d >= nblocks:
            continue
        e = min(nblocks, d + per_event)
        stored = BlockStored(
            block_hashes=tuple(bases[s][d:e]), parent_hash=bases[s][d - 1] if d else None
        )
        out.append(KvEventBatch(worker_id=f"w{w:02d}", event_id=next_id[w], events=(stored,)))
        next_id[w] += 1
        depth[(w, s)] = e
    return out


def _timed(fn: Callable[[int], object], iters: int) -> dict[str, float]:
    samples = []
    for i in range(iters):
        t0 = time.perf_counter_ns()
        fn(i)
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return {
        "p50_us": round(samples[len(samples) // 2] / 1000, 2),
        "p99_us": round(samples[int(len(samples) * 0.99)] / 1000, 2),
        "mean_us": round(statistics.mean(samples) / 1000, 2),
        "n": len(samples),
    }


def part_a(
    *, workers: int = 16, events: int = 10_000, iters: int = 1000, seed: int = 7
) -> dict[str, Any]:
    """Events applied per second and decision latency, in process."""
    rng = random.Random(seed)
    tokens = [[rng.randrange(1, 150_000) for _ in range(SEQ_TOKENS)] for _ in range(64)]
    bases = [prefix_hashes(t, BLOCK) for t in tokens]
    batches = _events(rng, bases, workers, events, per_event=16)
    frames = [codec.encode(b) for b in batches]

    sync = KvSync()
    t0 = time.perf_counter()
    for seq, frame in enumerate(frames, 1):
        sync.on_batch(codec.decode(frame, KvEventBatch), seq)
    decode_apply_s = time.perf_counter() - t0
    apply_only = KvSync()
    t0 = time.perf_counter()
    for seq, batch in enumerate(batches, 1):
        apply_only.on_batch(batch, seq)
    apply_s = time.perf_counter() - t0

    core = RoutingCore(CoreSettings(mode="kv", router_id="bench"), sync=sync)
    cards = [
        WorkerCard(worker_id=f"w{w:02d}", model=MODEL, block_size=BLOCK, kv_blocks=16384)
        for w in range(workers)
    ]
    decide_rng = random.Random(seed)

    def gen(rid: str, prompt: list[int], hashed: bool = True) -> Generate:
        """As the preprocessor sends it: block hashes made upstream (``hashed``), or none."""
        hashes = tuple(prefix_hashes(prompt, BLOCK)) if hashed else ()
        return Generate(
            request_id=rid, model=MODEL, token_ids=tuple(prompt),
            sampling=SamplingParams(), stream_to="bench",
            block_hashes=hashes, hash_block_size=BLOCK if hashed else 0,
        )  # fmt: skip

    for i in range(64):  # background load: 64 active requests
        core.commit(core.decide(gen(f"bg{i}", tokens[i][:2048]), cards, now=0, rng=decide_rng), 0)

    res: dict[str, Any] = {
        "workers": workers,
        "events": len(batches),
        "blocks_per_event": 16,
        "stored_blocks_total": sync.index.num_entries,
        "index_nodes": sync.index.num_nodes,
        "events_per_s_decode_and_apply": round(len(frames) / decode_apply_s),
        "events_per_s_apply": round(len(batches) / apply_s),
        "blocks_per_s_apply": round(sync.index.num_entries / apply_s),
        "active_requests": len(core.load),
    }
    for ntok in (1024, 8192):
        hits = [gen(f"h{ntok}-{i}", tokens[i % 64][:ntok] + [7] * 5) for i in range(64)]
        misses = [gen(f"m{ntok}-{i}", [rng.randrange(1, 150_000) for _ in range(ntok)])
                  for i in range(8)]  # fmt: skip
        bare = [msgspec.structs.replace(g, block_hashes=(), hash_block_size=0) for g in hits]
        hit_hashes = [g.block_hashes for g in hits]
        res[f"decide_{ntok}tok_hit"] = _timed(
            lambda i, h=hits: core.decide(h[i % 64], cards, now=0, rng=decide_rng), iters
        )
        res[f"decide_{ntok}tok_miss"] = _timed(
            lambda i, m=misses: core.decide(m[i % 8], cards, now=0, rng=decide_rng), iters
        )
        res[f"decide_{ntok}tok_hit_hashed_here"] = _timed(
            lambda i, h=bare: core.decide(h[i % 64], cards, now=0, rng=decide_rng), iters
        )
        res[f"hash_{ntok}tok"] = _timed(
            lambda i, h=hits: prefix_hashes(h[i % 64].token_ids, BLOCK), iters
        )
        res[f"find_matches_{ntok}tok_hit"] = _timed(
            lambda i, hh=hit_hashes: sync.index.find_matches(hh[i % 64]), iters
        )
        best = core.decide(hits[0], cards, now=0, rng=decide_rng)
        res[f"example_overlaps_{ntok}tok"] = sorted(
            (c.overlap_blocks for c in best.candidates), reverse=True
        )[:4]
    directory = LiveWorkers(ttl_s=10.0)
    for card in cards:
        directory.put(msgspec.structs.replace(card, heartbeat_at=time.time()))
    res["live_workers_of_model"] = _timed(lambda i: directory.for_model(MODEL, time.time()), iters)
    res["loadavg"] = os.getloadavg()
    return res


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def shared_prefix_chats(
    requests: int, prefixes: int, prefix_words: int, user_words: int, seed: int = 11
) -> list[list[dict[str, str]]]:
    """Each chat: one of ``prefixes`` fixed system prompts + a unique user message."""
    rng = random.Random(seed)
    systems = [_words(rng, prefix_words) for _ in range(prefixes)]
    return [
        [
            {"role": "system", "content": systems[rng.randrange(prefixes)]},
            {
                "role": "user",
                "content": f"{i} " + " ".join(rng.choice(WORDS) for _ in range(user_words)),
            },
        ]
        for i in range(requests)
    ]


def serving_workload(mode: str, **options: Any) -> dict[str, Any]:
    """Part (b): the shared-prefix workload against a fresh local stack routing in ``mode``.

    4 mockers (``--speedup-ratio 1 --block-size 16 --num-gpu-blocks-override 1024``), 400
    streaming chats at concurrency 16, 32 output tokens, each one of 8 ~2800-word system prompts
    plus a unique 50-word user message (the shape of the Dynamo bench kit's workload (c)).
    """
    requests = int(options.get("requests", 400))
    model_dir = ensure_default_model_dir(default_model_dir())
    stack = Stack(
        StackConfig(
            http_port=0,
            grpc_port=0,
            workers=4,
            router_mode=mode,
            model_path=str(model_dir),
            model_name=DEFAULT_MODEL_NAME,
            mocker_args="--speedup-ratio 1 --block-size 16 --num-gpu-blocks-override 1024",
            log_level="WARNING",
            namespace=f"benchrt{os.getpid()}",
        )
    )
    stack.start()
    try:
        pids = stack.pids()
        chats = shared_prefix_chats(requests, 8, 2800, 50)
        asyncio.run(warm_up(stack.base_url, DEFAULT_MODEL_NAME))
        before = {k: cpu_s(p) for k, p in pids.items()}
        records, wall = asyncio.run(run_chats(stack.base_url, DEFAULT_MODEL_NAME, chats, 16, 32))
        cpu = {k: cpu_s(p) - before[k] for k, p in pids.items()}
    finally:
        stack.stop()
        stack.remove_run_dir()
    spec = {"concurrency": 16, "requests": requests, "max_tokens": 32}
    summary = summarize(f"shared-prefix/{mode}", spec, records, wall, cpu)
    ok = [r for r in records if r.ok]
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    summary["kv_hit_rate"] = round(sum(r.cached_tokens for r in ok) / max(1, prompt_tokens), 4)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__)
    parser.add_argument("--part", choices=["a", "b"], nargs="+", default=["a"])
    parser.add_argument("--workers", type=int, nargs="+", default=[16, 256, 1024])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--modes", nargs="+", default=["kv", "round-robin"], help="part (b)")
    parser.add_argument("--out", type=Path, help="write the JSON (with samples) here; plots beside")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {}
    if "a" in args.part:
        out["a"] = {
            str(n): part_a(workers=n, events=args.events, iters=args.iters, seed=args.seed)
            for n in args.workers
        }
        out["a_decide_p50_us"] = {
            n: {k.removeprefix("decide_"): v["p50_us"] for k, v in a.items() if "decide" in k}
            for n, a in out["a"].items()
        }
    if "b" in args.part:
        out["b"] = {mode: serving_workload(mode) for mode in args.modes}
    print(json.dumps(without_samples(out), indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out) + "\n")
        plots.report(args.out)


if __name__ == "__main__":
    main()
