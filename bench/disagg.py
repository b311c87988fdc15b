"""Disaggregated prefill/decode, JetServe side by side with NVIDIA Dynamo 1.6.1
(``make bench-disagg``, issue 24).

    python -m bench.disagg [--systems jetserve,dynamo] [--modes agg,disagg] [--concurrency 16,64]
                           [--rounds 2] [--quick] [--out FILE] [--no-plots] [--no-install]

Workload: long unique prompts, 4,000 to 8,000 words each (about as many tokens with the Qwen3
tokenizer; ``--prompt-words``), 256 output tokens (``ignore_eos``), streamed chat completions at
each ``--concurrency``. Server: mockers with their realistic timing (speedup 1), block size 16,
16,384 KV blocks each, KV routing; ``agg`` = 4 aggregated workers, ``disagg`` = 2 prefill + 2
decode workers, whose decode side pulls the prompt's KV at 25 GB/s (``--kv-transfer-gbps``, both
mockers). Both systems serve the kit's model dir as ``Qwen/Qwen3-0.6B``:

* JetServe as a user starts it: ``jetserve up --router-mode kv --mocker-speedup-ratio 1 …`` with
  ``--workers 4``, or ``--workers 0 --prefill-workers 2 --decode-workers 2``; ready at its "JetServe
  is up" line, stopped with SIGINT (``bench.side_by_side``'s helpers).
* Dynamo through the Dynamo reference bench kit: ``ROUTER_MODE=kv NUM_WORKERS=4 SPEEDUP=1
  dynamo_up.sh``, or ``PREFILL_WORKERS=2 NUM_WORKERS=2`` (2 prefill-only + 2 decode-only mockers);
  ``dynamo_down.sh`` stops exactly what it started.

Every port is picked free; a disaggregated stack is probed (``nvext.extra_fields:
["worker_id"]``) until an answer names a prefill worker other than the decode worker; a stack
whose probes do not within 20 s is measured anyway, flagged by a printed line and the checks.
One client for both: the kit's ``loadgen.py --client raw`` under the kit venv's python, through
``bench/loadgen_spread.py`` (the prompt lengths' spread, pooled token-gap tails, per-request
samples). A run's ``--seed`` depends on its round and concurrency only
(``bench.disagg_report.seed_for``): every system and mode gets the same prompts
(``prompts_sha256``), and the next run on a stack gets other prompts, so no run hits a cache.

Order (``bench.disagg_report.schedule``): each round starts every (system, mode) stack fresh in
turn, systems alternating within a mode; even rounds run in reverse. One stack serves its
concurrencies one after the other, ``--pause-s`` apart.

Every run prints one JSON line (``bench.disagg_report.run_line``: ``system``, ``mode``,
``concurrency``, ``ttft_ms_p50/p99``, ``itl_ms_p50/p99`` (per request: its mean gap after the first
token, as the kit computes it), ``output_tok_s``, the pooled token gaps' p50/p99/p99.9/max
(``chunk_gap_ms_*``: where a decode step stalled by a long prefill shows), requests, errors,
``prompt_tokens_mean``, ``duration_s``, CPU ms per request per process, the load average at start
and end…), appended with its samples to ``--out`` (default ``.bench/<UTC time>-disagg.jsonl``);
the last line has the medians over the rounds, the disagg/agg ratios per system and the checks.
The plots (``bench.disagg_plots``) are drawn beside the file.

Without the kit's venv, ``install_dynamo.sh`` and ``make_model_dir.py`` are run first (PyPI only;
``--no-install``: print the commands instead and measure JetServe alone). ``--systems jetserve``
needs no Dynamo (the kit's ``loadgen.py`` still). Exit status 1 when a run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from bench.disagg_plots import report as plot_report
from bench.disagg_report import (
    DISAGG,
    MODES,
    Stint,
    error_line,
    requests_for,
    run_line,
    schedule,
    seed_for,
    summarize,
    worker_layout,
    worker_phases,
)
from bench.side_by_side import (
    CACHE,
    ROOT,
    Client,
    Kit,
    Running,
    _find_kit_dir,
    _stop_launcher,
    _wait_up_line,
    appending,
    choose_client,
    emit,
    kit_running,
)
from bench.side_by_side_report import DYNAMO, JETSERVE, SERVER, parse_summary
from services.cli.stack import free_ports
from shared.model_dir import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model_dir

SPREAD = ROOT / "bench" / "loadgen_spread.py"
SYSTEMS = (JETSERVE, DYNAMO)
PROBE_TIMEOUT_S = 20.0
CLIENT_TIMEOUT_S = 900.0


@dataclass(frozen=True, slots=True)
class Settings:
    """One bench's workload and server set-up, the same for both systems."""

    workers: int = 4
    """Mockers per stack: all aggregated, or half prefill and half decode."""
    speedup: float = 1.0
    block_size: int = 16
    gpu_blocks: int = 16384
    kv_transfer_gbps: float = 25.0
    prompt_words: tuple[int, int] = (4000, 8000)
    max_tokens: int = 256
    requests_per_client: float = 4.0
    min_requests: int = 128
    warmup: int = 2
    pause_s: float = 5.0
    model_name: str = DEFAULT_MODEL_NAME
    jetserve_args: tuple[str, ...] = ()
    """More ``jetserve up`` flags, appended."""
    dynamo_mocker_args: tuple[str, ...] = ()
    """More ``dynamo.mocker`` flags (the kit's ``EXTRA_MOCKER_ARGS``)."""


DEFAULTS = Settings()


def _count(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def jetserve_argv(settings: Settings, mode: str, model_dir: Path, run_dir: Path) -> list[str]:
    """``jetserve up`` as a user types it for ``mode``, on free ports, logging warnings only."""
    script = Path(sys.executable).with_name("jetserve")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "services.cli"]
    half = settings.workers // 2
    fleet = ["--workers", str(settings.workers)]
    if mode == DISAGG:
        fleet = ["--workers", "0", "--prefill-workers", str(half)]
        fleet += ["--decode-workers", str(settings.workers - half)]
    return [
        *launcher, "up", "--http-port", "0", "--grpc-port", "0", *fleet, "--embedders", "0",
        "--router-mode", "kv", "--model-path", str(model_dir),
        "--model-name", settings.model_name, "--log-level", "WARNING", "--run-dir", str(run_dir),
        "--mocker-speedup-ratio", f"{settings.speedup:g}",
        "--mocker-block-size", str(settings.block_size),
        "--mocker-num-gpu-blocks-override", str(settings.gpu_blocks),
        "--mocker-kv-transfer-bandwidth-gbps", f"{settings.kv_transfer_gbps:g}",
        *settings.jetserve_args,
    ]  # fmt: skip


def dynamo_env(
    settings: Settings, mode: str, kit: Kit, ports: tuple[int, int], run_dir: Path
) -> dict[str, str]:
    """The kit's ``dynamo_up.sh`` knobs for ``mode`` (``ports``: HTTP, NATS)."""
    half = settings.workers // 2
    mocker_args = ["--kv-transfer-bandwidth", f"{settings.kv_transfer_gbps:g}"]
    return {
        **kit.up_env(settings.model_name, ports, run_dir, "kv"),
        "SPEEDUP": f"{settings.speedup:g}",
        "BLOCK_SIZE": str(settings.block_size),
        "NUM_GPU_BLOCKS": str(settings.gpu_blocks),
        "NUM_WORKERS": str(settings.workers - half if mode == DISAGG else settings.workers),
        "PREFILL_WORKERS": str(half if mode == DISAGG else 0),
        "EXTRA_MOCKER_ARGS": shlex.join([*mocker_args, *settings.dynamo_mocker_args]),
    }


def client_argv(
    settings: Settings, client: Client, running: Running, concurrency: int, seed: int, label: str
) -> list[str]:
    """The kit's client through ``bench/loadgen_spread.py``, CPU charged to the stack's
    processes (every NAME.pid of its run dir, and the named PIDs with their descendants)."""
    low, high = settings.prompt_words
    requests = requests_for(concurrency, settings.requests_per_client, settings.min_requests)
    return [
        client.python, str(SPREAD), str(client.loadgen), "--prompt-words-max", str(high),
        "--url", running.url, "--model", settings.model_name, "--client", "raw",
        "--endpoint", "chat", "-c", str(concurrency), "-n", str(requests),
        "--prompt-words", str(low), "--max-tokens", str(settings.max_tokens), "--ignore-eos",
        "--warmup", str(settings.warmup), "--seed", str(seed),
        "--cpu-pid-dir", str(running.pid_dir),
        *[a for name, pid in running.pids.items() for a in ("--cpu-pid", f"{name}={pid}")],
        "--label", label, "--compact",
    ]  # fmt: skip


@contextlib.contextmanager
def jetserve_up(settings: Settings, mode: str, model_dir: Path, work: Path) -> Iterator[Running]:
    """``jetserve up`` for ``mode`` until its UP line; SIGINT to the launcher after."""
    run_dir, log_path = work / "jetserve", work / "jetserve-up.log"
    argv = jetserve_argv(settings, mode, model_dir, run_dir)
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT)
    try:
        yield Running(url=_wait_up_line(proc, log_path), pid_dir=run_dir, pids={SERVER: proc.pid})
    finally:
        _stop_launcher(proc, run_dir)


@contextlib.contextmanager
def dynamo_up(settings: Settings, mode: str, kit: Kit, work: Path) -> Iterator[Running]:
    """The kit's ``dynamo_up.sh`` for ``mode`` in a private run dir; ``dynamo_down.sh`` after."""
    run_dir = work / "dynamo"
    http_port, nats_port = free_ports(2)
    env = {**os.environ, **dynamo_env(settings, mode, kit, (http_port, nats_port), run_dir)}
    with kit_running(kit, env):
        yield Running(url=f"http://127.0.0.1:{http_port}", pid_dir=run_dir)


def probe(url: str, model: str) -> dict[str, Any]:
    """One short chat completion asking which workers served it (``nvext.worker_id``)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "which workers?"}],
        "max_tokens": 2,
        "nvext": {"extra_fields": ["worker_id"]},
    }
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def wait_disaggregated(
    url: str, model: str, timeout_s: float = PROBE_TIMEOUT_S
) -> tuple[dict[str, Any] | None, str]:
    """The phases of the first probe that names a prefill worker other than the decode worker,
    else ``None`` after ``timeout_s``; and the last answer's ``nvext`` (or error), to report."""
    deadline, last = time.monotonic() + timeout_s, "no answer"
    while time.monotonic() < deadline:
        try:
            answer = probe(url, model)
        except (OSError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            last = f"nvext {json.dumps(answer.get('nvext'))}"
            if phases := worker_phases(answer):
                return phases, last
        time.sleep(0.5)
    return None, last


def run_client(argv: list[str]) -> dict[str, Any]:
    """The client's summary, errors or not (it exits 1 when a request failed); ``RuntimeError``
    with its stderr when it printed none."""
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, check=False, cwd=ROOT
    )
    try:
        return parse_summary(result.stdout)
    except ValueError as exc:
        tail = result.stderr[-1500:]
        raise RuntimeError(f"the client exited {result.returncode}: {tail}") from exc


@dataclass(frozen=True, slots=True)
class Bench:
    settings: Settings
    kit: Kit
    client: Client
    model_dir: Path


def run_stint(bench: Bench, stint: Stint, out: TextIO | None) -> list[dict[str, Any]]:
    """Start the stack, run the client at each concurrency, stop it: a line per run (an error
    line for the stint when the stack did not start)."""
    settings, lines = bench.settings, []
    with tempfile.TemporaryDirectory(prefix=f"jetserve-disagg-{stint.system}-") as tmp:
        work = Path(tmp)
        if stint.system == DYNAMO:
            started = dynamo_up(settings, stint.mode, bench.kit, work)
        else:
            started = jetserve_up(settings, stint.mode, bench.model_dir, work)
        try:
            with started as running:
                phases = None
                if stint.mode == DISAGG:
                    phases, last = wait_disaggregated(running.url, settings.model_name)
                    if phases is None:  # measured anyway; the summary's checks name it
                        print(
                            f"bench-disagg: {stint.system} disagg: no probe named a prefill "
                            f"worker in {PROBE_TIMEOUT_S:.0f} s ({last})",
                            flush=True,
                        )
                for c in stint.concurrencies:
                    time.sleep(settings.pause_s)
                    seed = seed_for(stint.round, c)
                    label = f"{stint.system}-{stint.mode}/c{c}#{stint.round}"
                    argv = client_argv(settings, bench.client, running, c, seed, label)
                    start = os.getloadavg()
                    try:
                        summary = run_client(argv)
                    except (RuntimeError, subprocess.SubprocessError) as exc:
                        line = error_line(stint, c, str(exc))
                    else:
                        line = run_line(
                            stint, c, summary, start, os.getloadavg(),
                            workers=worker_layout(stint.mode, settings.workers), phases=phases,
                        )  # fmt: skip
                    emit(line, out)
                    lines.append(line)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            line = error_line(stint, None, str(exc))
            emit(line, out)
            lines.append(line)
    return lines


def ensure_kit(kit: Kit, install: bool) -> list[str]:
    """What of the kit is still missing, after running its installers when ``install``."""
    if kit.missing() and install and (kit.dir / "install_dynamo.sh").exists():
        print(f"installing the Dynamo kit into {kit.venv} (PyPI only) …", flush=True)
        for argv, env in (
            (["bash", str(kit.dir / "install_dynamo.sh")], {"VENV": str(kit.venv)}),
            ([str(kit.python), str(kit.dir / "make_model_dir.py"), str(kit.model_dir)], {}),
        ):
            done = subprocess.run(
                argv, env={**os.environ, **env}, capture_output=True, text=True, check=False
            )
            if done.returncode:
                print(f"{argv[-1]} exited {done.returncode}: {done.stderr[-1000:]}", flush=True)
                break
    return kit.missing()


def install_commands(kit: Kit) -> str:
    """The commands that install the kit where ``Kit`` looks for it."""
    return (
        f"VENV={shlex.quote(str(kit.venv))} bash {shlex.quote(str(kit.dir / 'install_dynamo.sh'))}"
        f" && {shlex.quote(str(kit.python))} {shlex.quote(str(kit.dir / 'make_model_dir.py'))}"
        f" {shlex.quote(str(kit.model_dir))}"
    )


def run(
    bench: Bench, stints: Sequence[Stint], out: TextIO | None
) -> tuple[list[dict[str, Any]], int]:
    """Every stint in order, a line per run, then the summary line; the lines and exit status."""
    lines = [line for stint in stints for line in run_stint(bench, stint, out)]
    emit(summarize(lines), out)
    return lines, int(any("error" in line for line in lines))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.disagg",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="jetserve,dynamo")
    parser.add_argument("--modes", default=",".join(MODES), help="agg,disagg")
    parser.add_argument("--concurrency", type=_count, default=[16, 64], help="16,64")
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, c requests")
    parser.add_argument("--requests-per-client", type=float, default=DEFAULTS.requests_per_client)
    parser.add_argument("--min-requests", type=int, default=DEFAULTS.min_requests)
    parser.add_argument("--prompt-words", type=_count, default=list(DEFAULTS.prompt_words))
    parser.add_argument("--max-tokens", type=int, default=DEFAULTS.max_tokens)
    parser.add_argument("--workers", type=int, default=DEFAULTS.workers)
    parser.add_argument("--kv-transfer-gbps", type=float, default=DEFAULTS.kv_transfer_gbps)
    parser.add_argument("--pause-s", type=float, default=DEFAULTS.pause_s)
    parser.add_argument("--jetserve-args", default="", help="more `jetserve up` flags")
    parser.add_argument("--dynamo-mocker-args", default="", help="more dynamo.mocker flags")
    parser.add_argument("--kit", type=Path, default=_find_kit_dir(), help="the kit's folder")
    parser.add_argument("--kit-venv", type=Path, default=CACHE / "dynamo-venv")
    parser.add_argument("--model-dir", type=Path, default=CACHE / "qwen3-model")
    parser.add_argument("--no-install", action="store_true", help="never install the kit")
    parser.add_argument("--out", type=Path, help="JSON lines file (default .bench/…-disagg.jsonl)")
    parser.add_argument("--no-plots", action="store_true", help="do not draw the plots")
    args = parser.parse_args(argv)
    bad = set(args.systems.split(",")) - set(SYSTEMS) or set(args.modes.split(",")) - set(MODES)
    if bad or len(args.prompt_words) != 2 or args.prompt_words[0] > args.prompt_words[1]:
        parser.error(f"bad --systems, --modes or --prompt-words LOW,HIGH ({bad or ''})")
    return args


def settings_of(args: argparse.Namespace) -> Settings:
    settings = Settings(
        workers=args.workers,
        kv_transfer_gbps=args.kv_transfer_gbps,
        prompt_words=(args.prompt_words[0], args.prompt_words[1]),
        max_tokens=args.max_tokens,
        requests_per_client=args.requests_per_client,
        min_requests=args.min_requests,
        pause_s=args.pause_s,
        jetserve_args=tuple(shlex.split(args.jetserve_args)),
        dynamo_mocker_args=tuple(shlex.split(args.dynamo_mocker_args)),
    )
    if args.quick:  # one round (``main``), a request per client: a smoke run of a few minutes
        return replace(settings, requests_per_client=1.0, min_requests=16, warmup=1, pause_s=1.0)
    return settings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    kit = Kit(dir=args.kit, venv=args.kit_venv, model_dir=args.model_dir)
    missing = ensure_kit(kit, install=not args.no_install) if DYNAMO in systems else kit.missing()
    if DYNAMO in systems and missing:
        print(f"bench-disagg: the Dynamo kit is not installed (missing {missing[0]}); to install: "
              f"{install_commands(kit)}; measuring JetServe alone", flush=True)  # fmt: skip
        systems.remove(DYNAMO)
    if not systems or not kit.loadgen.exists():
        print(f"bench-disagg: nothing to measure (systems {systems}, client {kit.loadgen})")
        return 2
    model_dir = kit.model_dir
    if not (model_dir / "config.json").exists():
        model_dir = ensure_default_model_dir(default_model_dir())
    client = choose_client(kit, installed=not missing)
    bench = Bench(settings_of(args), kit, client, model_dir)
    rounds = 1 if args.quick else args.rounds
    stints = schedule(rounds, systems, [m for m in args.modes.split(",") if m], args.concurrency)
    out_path = args.out or ROOT / ".bench" / time.strftime(
        "%Y-%m-%dT%H%M%SZ-disagg.jsonl", time.gmtime()
    )
    with appending(out_path) as out:
        _, code = run(bench, stints, out)
    print(f"lines: {out_path}", flush=True)
    if not args.no_plots:
        plot_report(out_path)
    return code


if __name__ == "__main__":
    sys.exit(main())
