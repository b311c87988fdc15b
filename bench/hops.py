"""The per-hop latency budget of a concurrency-1 request (issue 13).

    python -m bench.hops [--requests 200] [--router-mode round-robin|kv] [--disagg] [--out FILE]

Starts JetServe as ``bench.side_by_side`` does (``jetserve up``, 2 mocker workers, speedup 0,
log level WARNING, the kit's model dir served as ``Qwen/Qwen3-0.6B`` when it is there), then
sends sequential streaming chat completions (32 prompt words, ``max_tokens`` 32,
``ignore_eos``) from one kept-alive connection (``bench.httpclient``): 5 warm-ups, then
``--requests`` without the observer, as many other prompts with it, and as many again
without it (``unobserved_again``: how much of the on/off difference is order and drift).

The observer (``bench.hops_observer``) is a separate process: one nats-py connection
subscribed to ``>`` (which includes ``$JS``/``$KV``/``_INBOX`` subjects and JetStream
deliveries) recording ``(time.time(), subject, reply, size)`` of every message. Its timestamps
are when its callback ran, so each hop's delta holds the publisher's work *and* the observer's
own wake-up; messages read in one socket read share a timestamp, and a delta can come out
negative when the observer wakes after the next hop already acted. The client stamps its send
with ``time.time()`` just before writing the request (≈20 µs before the bytes go out) and its
first content byte / end as that plus ``bench.httpclient``'s TTFT / end-to-end time.

At c=1 every message between one request's send and the next send is charged to that request
(``bench.hops_report``), except that a message naming a request id in its subject or reply
(stream, gateway, bounce; ``Generate`` and ``StreamOpen`` reply to bounce subjects) goes to
that request even when the observer read it after the next send. Subjects are templated (ids →
``<worker>``, ``<request>``…) and classed ``path``, ``side_effect`` (decisions, lifecycle,
load, KV events) or ``periodic`` (heartbeats, watch checks; charged per request by time). CPU
ms and context switches per request are read from /proc for every process of the run dir
(``server``: the launcher and all its descendants, ``launcher``: that tree beyond the named
services), this client, the observer and the machine, for both runs; the 1-minute load
average just before each run. One JSON object on stdout (and appended to
``--out``); a table on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

from bench import hops_report
from bench.hops_observer import READY
from bench.httpclient import Connection
from bench.serving import cpu_s, prompts
from bench.side_by_side import CACHE, ROOT, jetserve_up
from bench.side_by_side_report import SERVER
from shared.config import CommonConfig
from shared.model_dir import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model_dir

WARMUP = 5
OBSERVER_READY_TIMEOUT_S = 30.0
OBSERVER_STOP_TIMEOUT_S = 30.0
CLK = os.sysconf("SC_CLK_TCK")
_NATS_IN_UP_LINE = re.compile(r"NATS (\S+?)\)")
UNOBSERVED, OBSERVED, AGAIN = "unobserved", "observed", "unobserved_again"
"""The three runs, in order: the last one shows what order alone changes."""


@dataclass(frozen=True, slots=True)
class Phase:
    """One run of the client: its requests and what the processes used meanwhile."""

    sent: list[hops_report.Sent]
    errors: int
    short: int
    """Requests that produced fewer than ``max_tokens`` tokens."""
    cpu_ms: dict[str, float]
    ctx_switches: dict[str, float]
    load1: float


def nats_url_of(up_log: str) -> str:
    """The NATS URL in ``jetserve up``'s "JetServe is up: … NATS nats://…)" line."""
    found = _NATS_IN_UP_LINE.search(up_log)
    if found is None:
        raise RuntimeError(f"no NATS URL in jetserve up's output: {up_log[-500:]!r}")
    return found.group(1)


def stack_pids(pid_dir: Path) -> dict[str, int]:
    """Every ``NAME.pid`` of the run dir (nats, gateway, preprocessor, …, mocker-0, …)."""
    return {p.stem: int(p.read_text().strip()) for p in sorted(pid_dir.glob("*.pid"))}


def ctx_switches(pid: int) -> float:
    """Voluntary + involuntary context switches of every thread of ``pid`` so far."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        with contextlib.suppress(OSError):
            for line in status.read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split(":")[1])
    return float(total)


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine (all cores) since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / CLK


def _client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def snapshot(pids: Mapping[str, int]) -> tuple[dict[str, float], dict[str, float]]:
    """(CPU s, context switches) per process now, plus ``client`` and ``machine`` CPU."""
    cpu = {name: cpu_s(pid) for name, pid in pids.items()}
    cpu["client"] = _client_cpu_s()
    cpu["machine"] = machine_cpu_s()
    ctx = {name: ctx_switches(pid) for name, pid in pids.items() if name != SERVER}
    ctx["client"] = ctx_switches(os.getpid())
    return cpu, ctx


def request_body(model: str, text: str, max_tokens: int) -> dict[str, object]:
    """A streaming chat completion as ``bench.serving`` sends it: ``ignore_eos``, usage on."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "ignore_eos": True,
    }


async def drive(
    url: str, model: str, texts: Sequence[str], max_tokens: int
) -> tuple[list[hops_report.Sent], int, int]:
    """One request after another on one kept-alive connection: (sent, errors, short)."""
    target = urlparse(url)
    conn = Connection(target.hostname or "127.0.0.1", target.port or 80)
    sent: list[hops_report.Sent] = []
    errors = short = 0
    try:
        for text in texts:
            body = request_body(model, text, max_tokens)
            send = time.time()
            try:
                rec = await conn.post_stream("/v1/chat/completions", body)
            except (OSError, ValueError, asyncio.IncompleteReadError):
                errors += 1
                await conn.close()
                continue
            errors += not rec.ok
            short += rec.ok and rec.completion_tokens < max_tokens
            first = None if rec.ttft_s is None else send + rec.ttft_s
            sent.append(hops_report.Sent(send=send, first_byte=first, end=send + rec.e2e_s))
    finally:
        await conn.close()
    return sent, errors, short


def run_phase(
    url: str,
    model: str,
    texts: Sequence[str],
    max_tokens: int,
    pids: Mapping[str, int],
    stack: Sequence[str],
) -> Phase:
    """The client once over ``texts``, with CPU and context switches around it."""
    load1 = os.getloadavg()[0]
    cpu0, ctx0 = snapshot(pids)
    sent, errors, short = asyncio.run(drive(url, model, texts, max_tokens))
    cpu1, ctx1 = snapshot(pids)
    n = max(1, len(texts))
    cpu = hops_report.split_cpu(hops_report.per_request(cpu0, cpu1, n, 1000.0), stack)
    ctx = hops_report.per_request(ctx0, ctx1, n)
    return Phase(sent, errors, short, cpu, ctx, round(load1, 2))


@contextlib.contextmanager
def observer(nats_url: str, out: Path) -> Iterator[subprocess.Popen[str]]:
    """``bench.hops_observer`` as its own process, ready; SIGTERM after (it writes ``out``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.hops_observer", "--nats-url", nats_url, "--out", str(out)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], OBSERVER_READY_TIMEOUT_S)
        if not ready or proc.stdout.readline().strip() != READY:
            raise RuntimeError(f"the observer did not get ready (exit {proc.poll()})")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(OBSERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_seen(path: Path) -> list[hops_report.Seen]:
    """The observer's JSON lines as ``Seen`` records, in time order."""
    seen = [hops_report.Seen(*json.loads(line)) for line in path.read_text().splitlines()]
    return sorted(seen, key=lambda m: m.t)


def provenance() -> dict[str, Any]:
    """The commit measured, the tracked files changed on top of it, and the ``JETSERVE_*``
    environment the stack inherits (read-only git: no index refresh)."""

    def git(*args: str) -> str:
        result = subprocess.run(
            ["git", "--no-optional-locks", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        return result.stdout.rstrip("\n") if result.returncode == 0 else ""

    changed = git("status", "--porcelain", "--untracked-files=no").splitlines()
    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "changed": [line[3:] for line in changed],
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("JETSERVE_")},
    }


def save_raw(raw_dir: Path, seen_path: Path, sent: Sequence[hops_report.Sent]) -> None:
    """Keep the observer's records and the observed requests (JSON lines) for a closer look."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(seen_path, raw_dir / "observed.jsonl")
    lines = [json.dumps([s.send, s.first_byte, s.end]) + "\n" for s in sent]
    (raw_dir / "sent.jsonl").write_text("".join(lines))


DISAGG_ARGS = ("--workers", "0", "--prefill-workers", "1", "--decode-workers", "1")


def measure(args: argparse.Namespace, model_dir: Path, namespace: str) -> dict[str, Any]:
    """Start the stack; run unobserved, observed, unobserved again; stop it: the report."""
    n, max_tokens, words = args.requests, args.max_tokens, args.prompt_words
    phases: dict[str, Phase] = {}
    with tempfile.TemporaryDirectory(prefix="jetserve-hops-") as tmp:
        work = Path(tmp)
        extra = DISAGG_ARGS if args.disagg else ()
        with jetserve_up(model_dir, work, args.model, args.router_mode, extra) as running:
            nats_url = nats_url_of((work / "jetserve-up.log").read_text())
            named = stack_pids(running.pid_dir)
            pids = {**named, **running.pids}

            def run(seed: int, watched: Mapping[str, int]) -> Phase:
                texts = prompts(n, words, seed=seed)
                return run_phase(running.url, args.model, texts, max_tokens, watched, list(named))

            asyncio.run(drive(running.url, args.model, prompts(WARMUP, words, seed=5), max_tokens))
            time.sleep(args.pause_s)
            phases[UNOBSERVED] = run(7, pids)
            seen_path = work / "observed.jsonl"
            with observer(nats_url, seen_path) as proc:
                time.sleep(args.pause_s)
                phases[OBSERVED] = run(8, {**pids, "observer": proc.pid})
            time.sleep(args.pause_s)
            phases[AGAIN] = run(9, pids)
            load_after = round(os.getloadavg()[0], 2)
        seen = read_seen(seen_path)
        if args.raw_dir is not None:
            save_raw(args.raw_dir, seen_path, phases[OBSERVED].sent)
    if not phases[OBSERVED].sent:
        raise RuntimeError("no observed request succeeded")
    return {
        "bench": "hops",
        "router_mode": args.router_mode,
        "disagg": args.disagg,
        "model": args.model,
        "namespace": namespace,
        "requests": n,
        "warmup": WARMUP,
        "max_tokens": max_tokens,
        "prompt_words": words,
        "observer": "separate process: nats-py subscribed to '>'",
        **provenance(),
        "phases": list(phases),
        "errors": {k: p.errors for k, p in phases.items()},
        "short": {k: p.short for k, p in phases.items()},
        "ttft": {k: hops_report.latency(p.sent) for k, p in phases.items()},
        **hops_report.budget(seen, phases[OBSERVED].sent, namespace),
        "cpu_ms_per_request": {k: p.cpu_ms for k, p in phases.items()},
        "ctx_switches_per_request": {k: p.ctx_switches for k, p in phases.items()},
        "load1": {**{k: p.load1 for k, p in phases.items()}, "after": load_after},
    }


def _emit(result: Mapping[str, Any], out: TextIO | None) -> None:
    text = json.dumps(result)
    print(text, flush=True)
    if out is not None:
        out.write(text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hops",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=200, help="measured requests per run")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--router-mode", default="round-robin", choices=("round-robin", "kv"))
    parser.add_argument("--model-dir", type=Path, default=CACHE / "qwen3-model")
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME)
    parser.add_argument("--pause-s", type=float, default=5.0, help="wait after ready / observer")
    parser.add_argument("--out", type=Path, help="also append the JSON line to this file")
    parser.add_argument(
        "--disagg",
        action="store_true",
        help="1 prefill + 1 decode worker instead of 2 aggregated ones (issue 24: what the "
        "second routing phase costs)",
    )
    parser.add_argument(
        "--raw-dir",
        type=Path,
        help="keep observed.jsonl [time, subject, reply, size] and sent.jsonl [send, first "
        "byte, end] of the observed run here",
    )
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be >= 1")
    model_dir = args.model_dir
    if not (model_dir / "config.json").exists():
        model_dir = ensure_default_model_dir(default_model_dir())
    # the namespace `jetserve up` gives its services: JETSERVE_NAMESPACE, else the default
    namespace = str(CommonConfig.settings().select("namespace").resolved()["namespace"])
    try:
        result = measure(args, model_dir, namespace)
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        print(f"bench.hops: {exc}", file=sys.stderr)
        return 1
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(args.out.open("a")) if args.out else None
        _emit(result, out)
    print(hops_report.render(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
