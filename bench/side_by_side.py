"""c=1 latency, JetServe side by side with NVIDIA Dynamo 1.6.1 (the Dynamo reference bench kit,
outside this repository: ``JETSERVE_BENCH_KIT`` names its directory).

    python -m bench.side_by_side [--rounds 3] [--dynamo auto|on|off] [--pause-s 5]
                                 [--out FILE [--no-plots]]

Workload (a) of the kit, with the kit's own client run by the kit venv's python, exactly as its
``workloads.sh`` runs it: ``loadgen.py --client raw --endpoint chat -c 1 -n 200 --max-tokens 32
--prompt-words 32`` (5 unmeasured warm-up requests first). Both systems serve the kit's model dir
as ``Qwen/Qwen3-0.6B`` with 2 mocker workers, no simulated delay and round-robin routing:
Dynamo through the kit's ``dynamo_up.sh`` (``SPEEDUP=1000000``; its mocker reads 0 as 1),
JetServe as a user starts it, ``jetserve up --mocker-speedup-ratio 0 --log-level WARNING`` (the
kit runs Dynamo at ``DYN_LOG=warn``), ready at its "JetServe is up" line, stopped with SIGINT.

Runs alternate Dynamo, JetServe, Dynamo, JetServe… for ``--rounds``. Each system is started
fresh for its run and stopped before the other starts: on 2 cores the idle processes of a
second stack (heartbeats, pollers) would be charged to whichever system is under load, in
``machine`` CPU and in wake-up latency, and a fresh start per round also samples start-to-start
variance. ``--pause-s`` seconds pass between "ready" and the client, as in ``workloads.sh``.

Every run prints one JSON line (``bench.side_by_side_report.run_line``): TTFT p50/p99, ITL p50,
req/s, CPU ms per request per process (each NAME.pid of the run dir; for JetServe also
``server``, the launcher with every descendant, and ``launcher``, what that tree used beyond
the named services), for the client and the whole machine (``unattributed``: the machine's CPU
beyond both, i.e. kernel work and anything else running), and the 1-minute load average read
just before the client started, and the run's per-request TTFT and ITL (``samples``: the kit's
``loadgen.py`` is run through ``bench/loadgen_samples.py``, which adds them to its summary). The
last line holds the per-system medians and the ratio JetServe/Dynamo of the TTFT p50. With
``--out`` the lines are appended to FILE too, and its plots (``bench.plots``) drawn beside it.

Without the kit (no venv, nats-server or model dir) ``--dynamo auto`` prints one line saying so
and measures JetServe alone: with the kit's ``loadgen.py`` if that file is there, else with
``bench.serving``'s own HTTP client (other prompts: not comparable with the kit's baseline).
``--dynamo on`` fails instead. Exit status 1 only when a JetServe run failed (or, with ``on``,
any run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bench import plots
from bench.samples import without_samples
from bench.side_by_side_report import DYNAMO, JETSERVE, SERVER, parse_summary, run_line, schedule
from bench.side_by_side_report import summarize as summarize_runs
from services.cli.stack import UP_LINE, free_ports
from shared.model_dir import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model_dir

ROOT = Path(__file__).resolve().parents[1]
LOADGEN_SAMPLES = ROOT / "bench" / "loadgen_samples.py"
CACHE = Path.home() / ".cache" / "jetserve-bench"
WORKLOAD_A = ["-c", "1", "-n", "200", "--max-tokens", "32", "--prompt-words", "32"]
"""The kit README's workload (a), as ``workloads.sh`` passes it."""
MAX_TOKENS = 32
START_TIMEOUT_S = 180.0
CLIENT_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0


def _run_checked(
    argv: list[str], what: str, timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` from the repository root, output captured; raise with its stderr's tail."""
    result = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False, cwd=ROOT
    )
    if result.returncode:
        raise RuntimeError(f"{what} exited {result.returncode}: {result.stderr[-1500:]}")
    return result


@dataclass(frozen=True, slots=True)
class Kit:
    """Where the reference kit's files are; ``missing()`` says what is not there."""

    dir: Path
    venv: Path
    model_dir: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def loadgen(self) -> Path:
        return self.dir / "loadgen.py"

    def missing(self) -> list[str]:
        wanted = [
            self.loadgen,
            self.dir / "dynamo_up.sh",
            self.dir / "dynamo_down.sh",
            self.python,
            self.venv / "bin" / "nats-server",
            self.model_dir / "config.json",
            self.model_dir / "tokenizer.json",
        ]
        return [str(p) for p in wanted if not p.exists()]

    def up_env(
        self, model_name: str, ports: tuple[int, int], run_dir: Path, router_mode: str
    ) -> dict[str, str]:
        """The knobs every ``dynamo_up.sh`` run sets (``ports``: HTTP, NATS); a bench adds its
        own (workers, speedup, frontends, …)."""
        return {
            "VENV": str(self.venv),
            "MODEL_DIR": str(self.model_dir),
            "MODEL_NAME": model_name,
            "HTTP_PORT": str(ports[0]),
            "NATS_PORT": str(ports[1]),
            "RUN_DIR": str(run_dir),
            "ROUTER_MODE": router_mode,
        }


@dataclass(frozen=True, slots=True)
class Running:
    """A started system: its base URL and the processes to charge CPU to."""

    url: str
    pid_dir: Path
    pids: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Client:
    """The load generator: an interpreter and the kit's ``loadgen.py`` (``None`` =
    ``bench.serving``)."""

    python: str
    loadgen: Path | None


@contextlib.contextmanager
def kit_running(kit: Kit, env: dict[str, str]) -> Iterator[None]:
    """The kit's ``dynamo_up.sh`` with ``env`` (raises with its stderr's tail if it fails);
    ``dynamo_down.sh`` after, which stops exactly the PIDs ``up`` wrote (also after a failed,
    half-done ``up``)."""
    try:
        _run_checked(
            ["bash", str(kit.dir / "dynamo_up.sh")], "dynamo_up.sh", START_TIMEOUT_S, env=env
        )
        yield
    finally:
        subprocess.run(
            ["bash", str(kit.dir / "dynamo_down.sh")],
            env=env,
            capture_output=True,
            timeout=STOP_TIMEOUT_S,
            check=False,
        )


@contextlib.contextmanager
def dynamo_up(kit: Kit, work: Path, model_name: str) -> Iterator[Running]:
    """The kit's ``dynamo_up.sh`` on free ports and a private run dir; ``dynamo_down.sh`` after
    (it stops exactly the PIDs ``up`` wrote)."""
    http_port, nats_port = free_ports(2)
    run_dir = work / "dynamo"
    env = {
        **os.environ,
        **kit.up_env(model_name, (http_port, nats_port), run_dir, "round-robin"),
        "NUM_WORKERS": "2",
        "SPEEDUP": "1000000",
    }
    with kit_running(kit, env):
        yield Running(url=f"http://127.0.0.1:{http_port}", pid_dir=run_dir)


def jetserve_argv(
    model_dir: Path,
    model_name: str,
    run_dir: Path,
    router_mode: str = "round-robin",
    extra: Sequence[str] = (),
) -> list[str]:
    """``jetserve up`` as a user types it, matched to the kit's set-up (a) and (b) (``extra``:
    more flags, which win over these)."""
    script = Path(sys.executable).with_name("jetserve")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "services.cli"]
    return [
        *launcher,
        "up",
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--workers",
        "2",
        "--router-mode",
        router_mode,
        "--mocker-speedup-ratio",
        "0",
        "--model-path",
        str(model_dir),
        "--model-name",
        model_name,
        "--log-level",
        "WARNING",
        "--run-dir",
        str(run_dir),
        *extra,
    ]


@contextlib.contextmanager
def jetserve_up(
    model_dir: Path,
    work: Path,
    model_name: str,
    router_mode: str = "round-robin",
    extra: Sequence[str] = (),
) -> Iterator[Running]:
    """``jetserve up``, ready at its UP line; SIGINT to the launcher after, and wait."""
    run_dir = work / "jetserve"
    log_path = work / "jetserve-up.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            jetserve_argv(model_dir, model_name, run_dir, router_mode, extra),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        url = _wait_up_line(proc, log_path)
        yield Running(url=url, pid_dir=run_dir, pids={SERVER: proc.pid})
    finally:
        _stop_launcher(proc, run_dir)


def _wait_up_line(proc: subprocess.Popen[bytes], log_path: Path) -> str:
    """The base URL from ``jetserve up``'s "JetServe is up: http://host:port/v1 …" line."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in log_path.read_text(errors="replace").splitlines():
            if line.startswith(UP_LINE):
                return line[len(UP_LINE) :].split()[0].removesuffix("/v1")
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"jetserve up exited {proc.returncode}: {tail}")
        time.sleep(0.1)
    raise RuntimeError(f"no {UP_LINE!r} line after {START_TIMEOUT_S:.0f} s; see {log_path}")


def _stop_launcher(proc: subprocess.Popen[bytes], run_dir: Path) -> None:
    """SIGINT (Ctrl-C) and wait; then SIGTERM; then SIGKILL the launcher and whichever of its
    services (the PIDs in the run dir, checked against their command line) outlived it."""
    for sig, wait_s in ((signal.SIGINT, STOP_TIMEOUT_S), (signal.SIGTERM, 10.0)):
        if proc.poll() is None:
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
            return
    proc.kill()
    proc.wait()
    for pid_file in run_dir.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"services." in cmdline or b"nats-server" in cmdline:
                os.kill(pid, signal.SIGKILL)


def client_argv(running: Running, client: Client, model_name: str, label: str) -> list[str]:
    """The kit's ``loadgen.py`` for workload (a), else ``bench.serving``'s workload (a)."""
    cpu = [f"{name}={pid}" for name, pid in running.pids.items()]
    if client.loadgen is not None:
        return [
            client.python,
            str(LOADGEN_SAMPLES),
            str(client.loadgen),
            "--url",
            running.url,
            "--model",
            model_name,
            "--client",
            "raw",
            "--endpoint",
            "chat",
            *WORKLOAD_A,
            "--cpu-pid-dir",
            str(running.pid_dir),
            *[a for spec in cpu for a in ("--cpu-pid", spec)],
            "--label",
            label,
            "--compact",
        ]
    pid_files = [f"{p.stem}={p.read_text().strip()}" for p in sorted(running.pid_dir.glob("*.pid"))]
    return [
        client.python,
        "-m",
        "bench.serving",
        "--url",
        running.url,
        "--model",
        model_name,
        "--workloads",
        "a",
        "--protocols",
        "http",
        "--http-api",
        "chat",
        "--dynamo",
        "off",
        "--pids",
        *pid_files,
        *cpu,
    ]


def choose_client(kit: Kit, installed: bool) -> Client:
    """The kit venv's python with ``loadgen.py`` when the kit is installed; ``loadgen.py`` with
    this python when only the file is there; else ``bench.serving`` with this python."""
    if installed:
        return Client(python=str(kit.python), loadgen=kit.loadgen)
    return Client(python=sys.executable, loadgen=kit.loadgen if kit.loadgen.exists() else None)


def _find_kit_dir() -> Path:
    return Path(os.environ.get("JETSERVE_BENCH_KIT", ROOT.parent / "shared" / "bench"))


def measure(
    system: str,
    round_no: int,
    kit: Kit,
    client: Client,
    model_dir: Path,
    model_name: str,
    pause_s: float,
) -> dict[str, Any]:
    """Start ``system`` fresh, run the client once, stop it: one report line."""
    label = f"{system}-rr/a#{round_no}"
    with tempfile.TemporaryDirectory(prefix=f"jetserve-c1-{system}-") as tmp:
        work = Path(tmp)
        if system == DYNAMO:
            started = dynamo_up(kit, work, model_name)
        else:
            started = jetserve_up(model_dir, work, model_name)
        with started as running:
            time.sleep(pause_s)
            load1 = os.getloadavg()[0]
            result = _run_checked(
                client_argv(running, client, model_name, label), "the client", CLIENT_TIMEOUT_S
            )
        return run_line(system, round_no, parse_summary(result.stdout), load1)


def run(
    rounds: int, mode: str, kit: Kit, pause_s: float, model_name: str, out: TextIO | None
) -> int:
    """Every run in order, one JSON line each, then the summary; the exit status."""
    missing = kit.missing()
    if missing and mode == "on":
        print(f"side by side: the Dynamo kit is not installed (missing {', '.join(missing)})")
        return 2
    with_dynamo = mode != "off" and not missing
    if mode == "auto" and missing:
        print(
            f"side by side: Dynamo kit not installed (missing {missing[0]}; see "
            f"{kit.dir}/README.md); measuring JetServe alone",
            flush=True,
        )
    model_dir = kit.model_dir if (kit.model_dir / "config.json").exists() else None
    if model_dir is None:
        model_dir = ensure_default_model_dir(default_model_dir())
    systems = [DYNAMO, JETSERVE] if with_dynamo else [JETSERVE]
    client = choose_client(kit, installed=not missing)
    lines: list[dict[str, Any]] = []
    code = 0
    for round_no, system in schedule(rounds, systems):
        try:
            line = measure(system, round_no, kit, client, model_dir, model_name, pause_s)
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
            line = {"system": system, "round": round_no, "error": str(exc)}
            if system == JETSERVE or mode == "on":
                code = 1
        emit(line, out)
        lines.append(line)
    emit(summarize_runs(lines, MAX_TOKENS), out)
    return code


def emit(line: dict[str, Any], out: TextIO | None) -> None:
    """Print one JSON line without its ``samples`` (hundreds of numbers), and append it whole
    to ``out`` (flushed: a bench may stop half-way)."""
    print(json.dumps(without_samples(line)), flush=True)
    if out is not None:
        out.write(json.dumps(line) + "\n")
        out.flush()


def appending(path: Path | None) -> contextlib.AbstractContextManager[TextIO | None]:
    """``path`` opened to append (its folder made), or ``None`` when there is no path."""
    if path is None:
        return contextlib.nullcontext()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("a")


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--dynamo`` and ``--rounds`` (``bench.serving`` takes them too)."""
    parser.add_argument(
        "--dynamo",
        default="auto",
        choices=("auto", "on", "off"),
        help="c=1 side by side with Dynamo: auto = when the kit is installed (else JetServe "
        "alone), on = fail without the kit, off = JetServe alone",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (A B A B …)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.side_by_side",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(parser)
    parser.add_argument("--kit", type=Path, default=_find_kit_dir(), help="the kit's folder")
    parser.add_argument("--kit-venv", type=Path, default=CACHE / "dynamo-venv")
    parser.add_argument("--model-dir", type=Path, default=CACHE / "qwen3-model")
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME)
    parser.add_argument("--pause-s", type=float, default=5.0, help="wait after ready")
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    parser.add_argument(
        "--no-plots", action="store_true", help="with --out: do not draw its plots after"
    )
    args = parser.parse_args(argv)
    kit = Kit(dir=args.kit, venv=args.kit_venv, model_dir=args.model_dir)
    with appending(args.out) as out:
        code = run(args.rounds, args.dynamo, kit, args.pause_s, args.model, out)
    if args.out and not args.no_plots:
        plots.report(args.out)
    return code


if __name__ == "__main__":
    sys.exit(main())
