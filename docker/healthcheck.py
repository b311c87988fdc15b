#!/usr/bin/env python3
"""Container health checks for JetServe services (stdlib only; installed in the image).

``jetserve-healthcheck http URL`` — healthy when ``URL`` answers 200 (the gateway's ``/live``).
``jetserve-healthcheck nats`` — healthy when this container holds an established TCP connection
to ``JETSERVE_NATS_URL`` (or ``NATS_URL``) and, where ``JETSERVE_HEALTH_NATS_MONITOR_URL`` names
the server's monitoring endpoint (a cluster's, comma-separated: those that answer are asked), a
server lists that connection with at least one subscription: the service is connected *and* has
subscribed to its subjects.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.parse
import urllib.request
from typing import Any

TIMEOUT_S = 3.0
_ESTABLISHED = "01"


def _fail(reason: str) -> None:
    raise SystemExit(f"unhealthy: {reason}")


def check_http(url: str) -> None:
    """Exit non-zero unless ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            if resp.status != 200:
                _fail(f"{url} answered {resp.status}")
    except OSError as exc:
        _fail(f"{url}: {exc}")


def _nats_endpoints() -> list[tuple[str, int]]:
    urls = (
        os.environ.get("JETSERVE_NATS_URL") or os.environ.get("NATS_URL") or "nats://127.0.0.1:4222"
    ).split(",")
    endpoints = []
    for url in urls:
        parsed = urllib.parse.urlsplit(url.strip() if "://" in url else f"nats://{url.strip()}")
        endpoints.append((parsed.hostname or "127.0.0.1", parsed.port or 4222))
    return endpoints


def _established_local_ports(remote_port: int) -> list[int]:
    """Local ports of this network namespace's TCP connections to ``remote_port``."""
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state == _ESTABLISHED and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                ports.append(int(local.rsplit(":", 1)[1], 16))
    return ports


def _listed_connections(monitors: list[str]) -> list[dict[str, Any]]:
    """Client connections listed by every monitoring endpoint that answers (a cluster's nodes);
    fails only when none answers."""
    conns: list[dict[str, Any]] = []
    errors = []
    timeout_s = max(1.0, TIMEOUT_S / len(monitors))  # all of them within the check's timeout
    for monitor in monitors:
        url = f"{monitor.rstrip('/')}/connz?subs=1&limit=1024"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                conns += json.load(resp).get("connections") or []
        except (OSError, ValueError) as exc:
            errors.append(f"{url}: {exc}")
    if len(errors) == len(monitors):
        _fail("; ".join(errors))
    return conns


def check_nats() -> None:
    """Exit non-zero unless this container is connected (and subscribed) to NATS."""
    endpoints = _nats_endpoints()
    local_ports = [p for _, port in endpoints for p in _established_local_ports(port)]
    if not local_ports:
        _fail(f"no established connection to NATS at {endpoints}")
    monitors = [
        m.strip() for m in os.environ.get("JETSERVE_HEALTH_NATS_MONITOR_URL", "").split(",")
    ]
    monitors = [m for m in monitors if m]
    if not monitors:
        return
    my_ip = socket.gethostbyname(socket.gethostname())
    conns = _listed_connections(monitors)
    mine = [c for c in conns if c.get("ip") == my_ip and c.get("port") in local_ports]
    if not mine:
        _fail(f"no NATS server lists {my_ip}:{local_ports}")
    if not any(c.get("subscriptions", 0) > 0 for c in mine):
        _fail("connected to NATS but subscribed to nothing")


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "http":
        check_http(argv[1])
    elif argv == ["nats"]:
        check_nats()
    else:
        _fail("usage: jetserve-healthcheck http URL | nats")


if __name__ == "__main__":
    main(sys.argv[1:])
