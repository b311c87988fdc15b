"""Fairness across router replicas, JetServe side by side with NVIDIA Dynamo 1.6.1
(``make bench-fairness``, issue 26).

    python -m bench.fairness [--systems jetserve,dynamo] [--scenarios single,skewed,sites]
                             [--rounds 2] [--duration-s 60] [--quick] [--out FILE]
                             [--sites-topology gateway|cluster] [--kill-router-at-s N]

Two policy classes, premium:regular weighted 4:1, share saturated mocker workers (speedup 1, the
mockers' realistic timing). Every request has a unique prompt (a random 64-bit hex prefix, then
``--prompt-words`` fixed words: about as many Qwen3 tokens, none of them cached anywhere) and few
output tokens, so the workers' prefill is the bottleneck and the routers must queue.
``--concurrency`` closed-loop clients per class send streamed chat completions back to back,
the class in the ``x-dynamo-meta-policy-class`` header. The measure: uncached prompt tokens
(``usage.prompt_tokens`` - ``cached_tokens``) of the requests that *completed* inside a
``--duration-s`` window, after ``--warmup-s`` of the same load, per class; ``share_ratio`` =
premium / regular, ``target_ratio`` 4.0. One client (this process, asyncio, one keep-alive
connection per client and gateway, TCP_QUICKACK re-armed) for both systems.

Scenarios:

* ``single``: one gateway and one router; every request through it (balanced ingress). Where the
  router queues by class this reads ≈ 4:1 — the check that the policy is on at all.
* ``skewed``: two gateways and two routers; ``--premium-skew`` (0.9) of premium requests and
  ``--regular-skew`` (0.5) of regular ones enter by gateway 0, the rest by gateway 1 (each
  request draws its gateway).
* ``sites`` (JetServe; issue 26's skew at the routers themselves): the same two gateways, the
  same draw, but as two sites, each a gateway, preprocessor, formatter and router on its own
  nats-server, the ``--workers`` mockers spread over both. In ``skewed`` the preprocessor hands
  every request to the routers' queue group on one server, so each router sees the same mix
  whatever the gateway split; here a site's requests stay at its router. ``--sites-topology
  gateway`` (the default): two one-node clusters joined by NATS gateways (a supercluster), which
  deliver a queue-group message in the publisher's cluster when it has a member;
  ``cluster``: one two-node cluster, which does not (nats-server 2.15.1 spread 1,000 messages
  published on one node ~50/50 over a queue group's members on both), kept to show that. Every
  ``RouteDecision`` on ``<ns>.v1.decisions`` is counted per router and class
  (``decisions_by_router``, ``premium_fraction_by_router``: the skew the routers saw).
  ``--kill-router-at-s N``: SIGKILL site b's router N s into the window; ``router_kill`` gives the
  share ratio over the 10 s before and after, the failed requests and the hung ones (unanswered
  for 30 s at the end). Dynamo is not run here (a ``skipped`` line): each Dynamo frontend embeds
  its router, so its ``skewed`` run already puts the gateway skew on each router.
  ``--jetserve-args`` (``jetserve up`` flags) do not reach ``sites``, which starts each service
  itself.

Servers (both serve the kit's model dir as ``Qwen/Qwen3-0.6B``, ``--workers`` mockers at speedup
1, block size 16, KV routing):

* Dynamo: the kit's ``dynamo_up.sh`` with ``FRONTENDS=1|2`` (each ``dynamo.frontend`` has its own
  KV router; they share the mockers, NATS and the file discovery) and ``--router-policy-config``
  (``bench.fairness_report.dynamo_policy_yaml``: policy family per class, DRR quanta 512:128,
  ``prefill_busy_threshold: --busy-prefill-tokens`` per class, which turns the router queue on).
* JetServe: our own ``nats-server -js -m <port>`` (monitoring on, for ``/varz``), then ``jetserve
  up --nats-url … --routers 1|2 --router-mode kv --admission-config <classes>
  --router-active-prefill-tokens-threshold --busy-prefill-tokens`` (and
  ``--router-active-decode-blocks-threshold`` with ``--busy-decode-blocks``); for ``skewed`` a
  second ``python -m services.gateway`` on the same NATS and namespace, with the same admission
  file.

The shared state's cost, per run: CPU µs per request of every process (utime + stime from
``/proc/<pid>/stat`` at the window's ends; ``router_cpu_us_per_req`` sums JetServe's routers,
``frontend_cpu_us_per_req`` Dynamo's frontends, which embed its routers), and for JetServe NATS
messages per request (``/varz`` ``in_msgs`` + ``out_msgs``). The mean router queue depth, sampled
each second from every router's ``/metrics``, shows that a system queued: Dynamo's
``dynamo_frontend_router_queue_pending_requests`` by class, JetServe's
``jetserve_router_queue_depth`` (no class label: ``all``).

Order: every scenario each round, the systems alternating within it (reversed in odd rounds),
each stack started fresh and stopped after its run. Every run prints one JSON line
(``bench.fairness_report.run_line``; ``loadavg_start``/``loadavg_end`` from ``os.getloadavg()``),
appended to ``--out`` (default ``.bench/<UTC time>-fairness.jsonl``); the last line is the summary
(medians, and each system's skewed/single ratio). Exit status 1 when a run failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from bench.fairness_client import Probe, drive
from bench.fairness_report import (
    SCENARIO,
    SCENARIOS,
    SITE_NAMES,
    SITES,
    TOPOLOGIES,
    Run,
    Scenario,
    cpu_us_per_request,
    decision_counts,
    error_line,
    kill_figures,
    per_request,
    premium_fraction,
    run_line,
    schedule,
    skipped_line,
    summarize,
    tally,
)
from bench.fairness_settings import DEFAULTS, DYNAMO_SITES, SYSTEMS, Settings
from bench.fairness_stacks import dynamo_stack, jetserve_sites_stack, jetserve_stack
from bench.side_by_side import (
    CACHE,
    ROOT,
    Kit,
    _find_kit_dir,
    appending,
    emit,
)
from bench.side_by_side_report import DYNAMO
from shared.model_dir import default_model_dir, ensure_default_model_dir

# --- a run --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bench:
    settings: Settings
    kit: Kit
    model_dir: Path


def measure(bench: Bench, system: str, scenario: Scenario, round_no: int) -> dict[str, Any]:
    """Start ``system`` fresh for ``scenario``, drive the load, stop it: the run's line."""
    settings = bench.settings
    with tempfile.TemporaryDirectory(prefix=f"jetserve-fairness-{system}-") as tmp:
        work = Path(tmp)
        if system == DYNAMO:
            stack_cm = dynamo_stack(settings, scenario, bench.kit, work)
        elif scenario.name == SITES:
            stack_cm = jetserve_sites_stack(settings, bench.model_dir, work)
        else:
            stack_cm = jetserve_stack(settings, scenario, bench.model_dir, work)
        with stack_cm as stack:
            time.sleep(settings.pause_s)
            probe = Probe(stack.pids, stack.varz_url, stack.queue_urls, stack.queue_metric)
            targets = [_host_port(url) for url in stack.urls]
            events = []
            kill_at = settings.kill_router_at_s if scenario.name == SITES else None
            if kill_at is not None:
                victim = stack.pids[f"router-{SITE_NAMES[-1]}"]
                events.append((kill_at, lambda: os.kill(victim, signal.SIGKILL)))
            load_start = os.getloadavg()
            done, start, end = asyncio.run(
                drive(settings, targets, probe, 1000 + round_no, stack.tap, events)
            )
            load_end = os.getloadavg()
            logs = _tails(work) if scenario.name == SITES else {}
    counts = tally(done, start, end)
    (ticks0, varz0), (ticks1, varz1) = probe.readings
    cpu = cpu_us_per_request(ticks0, ticks1, counts["ok"], os.sysconf("SC_CLK_TCK"))
    run = Run(system, scenario, round_no, settings.duration_s, settings_line(settings))
    line = run_line(
        run, counts, cpu, per_request(varz0, varz1, counts["ok"]), (load_start, load_end),
        probe.queue_depth_mean(),
    )  # fmt: skip
    if stack.tap is not None:
        by_router = decision_counts(stack.tap.decisions, start, end)
        if scenario.name == SITES:
            line["nats_topology"] = settings.sites_topology
        line["decisions_by_router"] = by_router
        line["premium_fraction_by_router"] = premium_fraction(by_router)
    if kill_at is not None:
        line["router_kill"] = kill_figures(done, start, start + kill_at, end)
        if stack.tap is not None:  # who routed once site b's router was gone
            after = decision_counts(stack.tap.decisions, start + kill_at, end)
            line["router_kill"]["decisions_after_kill"] = {
                router: mine["requests"] for router, mine in after.items()
            }
    if logs:
        line["log_warnings"] = logs
    return line


def _tails(work: Path, lines: int = 3) -> dict[str, list[str]]:
    """The last ``lines`` lines of each service log that has any (they log at WARNING)."""
    out = {}
    for path in sorted(work.glob("*.log")):
        if path.name.startswith("nats-"):
            continue
        with contextlib.suppress(OSError):
            if text := path.read_text(errors="replace").strip():
                out[path.stem] = [ln[:300] for ln in text.splitlines()[-lines:]]
    return out


def settings_line(settings: Settings) -> dict[str, Any]:
    """The settings a line carries (the knobs that differ between sittings)."""
    keep = (
        "workers", "prompt_words", "max_tokens", "concurrency", "premium_skew", "regular_skew",
        "busy_prefill_tokens", "busy_decode_blocks", "warmup_s", "speedup", "kill_router_at_s",
    )  # fmt: skip
    return {k: v for k, v in asdict(settings).items() if k in keep}


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").partition(":")
    return host, int(port.split("/")[0])


def run(
    bench: Bench, order: Sequence[tuple[int, str, str]], out: TextIO | None
) -> tuple[list[dict[str, Any]], int]:
    """Every run in ``order``, a line each, then the summary line; the lines and exit status."""
    lines = []
    for round_no, scenario_name, system in order:
        scenario = SCENARIO[scenario_name]
        if system == DYNAMO and scenario.name == SITES:
            emit(skipped_line(system, scenario, round_no, DYNAMO_SITES), out)
            continue
        try:
            line = measure(bench, system, scenario, round_no)
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
            line = error_line(system, scenario, round_no, f"{type(exc).__name__}: {exc}")
        emit(line, out)
        lines.append(line)
    emit(summarize(lines), out)
    return lines, int(any("error" in line for line in lines))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fairness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="jetserve,dynamo")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="single,skewed,sites")
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds")
    parser.add_argument("--duration-s", type=float, default=DEFAULTS.duration_s)
    parser.add_argument("--warmup-s", type=float, default=DEFAULTS.warmup_s)
    parser.add_argument("--quick", action="store_true", help="1 round, 20 s windows, 5 s warm-up")
    parser.add_argument("--workers", type=int, default=DEFAULTS.workers)
    parser.add_argument("--concurrency", type=int, default=DEFAULTS.concurrency, help="per class")
    parser.add_argument("--prompt-words", type=int, default=DEFAULTS.prompt_words)
    parser.add_argument("--max-tokens", type=int, default=DEFAULTS.max_tokens)
    parser.add_argument("--premium-skew", type=float, default=DEFAULTS.premium_skew)
    parser.add_argument("--regular-skew", type=float, default=DEFAULTS.regular_skew)
    parser.add_argument(
        "--busy-prefill-tokens", type=int, default=DEFAULTS.busy_prefill_tokens,
        help="busy above this many active prefill tokens per worker (both systems)",
    )  # fmt: skip
    parser.add_argument(
        "--busy-decode-blocks", type=float, default=None,
        help="JetServe's --router-active-decode-blocks-threshold (fraction; unset = off)",
    )  # fmt: skip
    parser.add_argument(
        "--sites-topology", choices=TOPOLOGIES, default=DEFAULTS.sites_topology,
        help="sites: gateway = two one-node clusters joined by gateways; cluster = one cluster",
    )  # fmt: skip
    parser.add_argument(
        "--kill-router-at-s", type=float, default=None,
        help="sites, JetServe: SIGKILL site b's router this many seconds into the window",
    )  # fmt: skip
    parser.add_argument("--jetserve-args", default="", help="more `jetserve up` flags")
    parser.add_argument("--dynamo-frontend-args", default="", help="more dynamo.frontend flags")
    parser.add_argument("--kit", type=Path, default=_find_kit_dir(), help="the kit's folder")
    parser.add_argument("--kit-venv", type=Path, default=CACHE / "dynamo-venv")
    parser.add_argument("--model-dir", type=Path, default=CACHE / "qwen3-model")
    parser.add_argument(
        "--out", type=Path, help="JSON lines file (default .bench/…-fairness.jsonl)"
    )
    args = parser.parse_args(argv)
    bad = set(args.systems.split(",")) - set(SYSTEMS) or set(args.scenarios.split(",")) - set(
        SCENARIOS
    )
    if bad:
        parser.error(f"unknown --systems or --scenarios: {sorted(bad)}")
    return args


def settings_of(args: argparse.Namespace) -> Settings:
    settings = Settings(
        workers=args.workers,
        prompt_words=args.prompt_words,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        premium_skew=args.premium_skew,
        regular_skew=args.regular_skew,
        busy_prefill_tokens=args.busy_prefill_tokens,
        busy_decode_blocks=args.busy_decode_blocks,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        jetserve_args=tuple(shlex.split(args.jetserve_args)),
        dynamo_frontend_args=tuple(shlex.split(args.dynamo_frontend_args)),
        sites_topology=args.sites_topology,
        kill_router_at_s=args.kill_router_at_s,
    )
    if args.quick:
        return replace(settings, duration_s=min(settings.duration_s, 20.0), warmup_s=5.0)
    return settings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    kit = Kit(dir=args.kit, venv=args.kit_venv, model_dir=args.model_dir)
    if DYNAMO in systems and (missing := kit.missing()):
        print(f"bench-fairness: the Dynamo kit is not installed (missing {missing[0]}; see "
              f"{kit.dir}/README.md); measuring JetServe alone", flush=True)  # fmt: skip
        systems.remove(DYNAMO)
    model_dir = kit.model_dir
    if not (model_dir / "config.json").exists():
        model_dir = ensure_default_model_dir(default_model_dir())
    bench = Bench(settings_of(args), kit, model_dir)
    rounds = 1 if args.quick else args.rounds
    order = schedule(rounds, systems, [s for s in args.scenarios.split(",") if s])
    out_path = args.out or ROOT / ".bench" / time.strftime(
        "%Y-%m-%dT%H%M%SZ-fairness.jsonl", time.gmtime()
    )
    with appending(out_path) as out:
        _, code = run(bench, order, out)
    print(f"lines: {out_path}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
