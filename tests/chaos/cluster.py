"""A 3-node NATS cluster on loopback for the chaos suite: no Docker needed.

Three ``nats-server -js`` processes this suite starts itself (random free ports, a store each,
routes to one another, docker/nats-cluster.conf's ping settings), so the node-loss scenarios run
wherever ``nats-server`` does, CI included; tests/compose/test_cluster.py runs the same faults on
the compose cluster. Only these processes are ever signalled, by pid.
"""

from __future__ import annotations

import contextlib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.cli.stack import free_ports, nats_server_binary
from tests.support import eventually

CONF = Path(__file__).resolve().parents[2] / "docker" / "nats-cluster.conf"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


@dataclass
class Node:
    name: str
    port: int
    cluster_port: int
    monitor_port: int
    store: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def monitor(self, path: str) -> dict[str, Any]:
        resp = httpx.get(f"http://127.0.0.1:{self.monitor_port}{path}", timeout=2)
        resp.raise_for_status()
        return dict(resp.json())

    @property
    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class LocalCluster:
    """``size`` nodes named ``n1``…; ``start()`` waits until JetStream has a meta leader."""

    workdir: Path
    size: int = 3
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        ports = iter(free_ports(3 * self.size))
        for i in range(1, self.size + 1):
            store = self.workdir / f"n{i}"
            self.nodes.append(Node(f"n{i}", next(ports), next(ports), next(ports), store))

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated: what the services get as ``--nats-url``."""
        return ",".join(node.url for node in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            self._launch(node)
        self.wait_ready()

    def _launch(self, node: Node) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise RuntimeError("nats-server not found; install the test extras")
        node.store.mkdir(parents=True, exist_ok=True)
        routes = ",".join(f"nats://127.0.0.1:{n.cluster_port}" for n in self.nodes)
        cmd = [
            binary, "-c", str(CONF), "-js", "-sd", str(node.store), "-a", "127.0.0.1",
            "-p", str(node.port), "-m", str(node.monitor_port), "--name", node.name,
            "--cluster_name", "chaos", "--cluster", f"nats://127.0.0.1:{node.cluster_port}",
            "--routes", routes,
        ]  # fmt: skip
        log = (self.workdir / f"{node.name}.log").open("ab")
        node.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every running node says /healthz ok (JetStream has a meta leader)."""
        eventually(
            lambda: all(_healthy(n) for n in self.nodes if n.is_running),
            timeout_s=timeout_s,
            interval_s=0.2,
            message="the NATS cluster was not ready",
        )

    def node_with(self, connection_prefix: str) -> Node:
        """The running node holding a client connection named ``connection_prefix…``."""
        for node in self.nodes:
            if not node.is_running:
                continue
            conns = node.monitor("/connz?limit=1024").get("connections") or []
            if any(str(c.get("name") or "").startswith(connection_prefix) for c in conns):
                return node
        raise LookupError(f"no node holds a connection named {connection_prefix}*")

    def node_without(self, connection_prefix: str) -> Node:
        """A running node not holding ``connection_prefix…``: the one with the most clients."""
        holder = self.node_with(connection_prefix)
        others = [n for n in self.nodes if n.is_running and n is not holder]
        return max(others, key=lambda n: int(n.monitor("/connz").get("num_connections", 0)))

    def stop_node(self, node: Node) -> None:
        """SIGTERM one of our nodes and wait for it to exit."""
        if node.proc is None or node.proc.poll() is not None:
            return
        node.proc.terminate()
        try:
            node.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait(timeout=5)

    def stop(self) -> None:
        for node in self.nodes:
            self.stop_node(node)


def _healthy(node: Node) -> bool:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        return node.monitor("/healthz").get("status") == "ok"
    return False
