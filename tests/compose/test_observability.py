"""The ``observability`` profile's Prometheus scrapes every service of the default stack.

The default services plus ``prometheus`` (the locally built image where none can be pulled;
Grafana's image cannot be pulled or built here, so it is left out), with router and mocker
scaled to two: Prometheus' ``/api/v1/targets`` must list every replica of every service,
all ``up``, a query must see the gateway's requests, and every dashboard query must parse.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.compose.test_compose import ComposeStack, _warm_up
from tests.observability import dashboard_exprs
from tests.support import eventually
from tests.support_containers import (
    ROOT,
    build_local_image_or_skip,
    compose_or_skip,
    up_on_free_ports,
)

pytestmark = [pytest.mark.compose, pytest.mark.timeout(600)]

SCALED = {"router": 2, "mocker": 2}
TARGETS_TIMEOUT_S = 120.0


def default_services() -> list[str]:
    """The compose services outside any profile: what ``docker compose up`` starts."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    return [name for name, svc in services.items() if "profiles" not in svc]


@pytest.fixture(scope="module")
def observed() -> Iterator[tuple[ComposeStack, int]]:
    """The stack and Prometheus' host port."""
    compose = compose_or_skip()
    build_local_image_or_skip("prometheus")
    project = f"jsobs{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "JETSERVE_PUBLISH_ADDR": "127.0.0.1", "JETSERVE_NAMESPACE": project}
    stack = ComposeStack(compose, project, env, http_port=0)
    scale = [a for name, n in SCALED.items() for a in ("--scale", f"{name}={n}")]
    try:
        up_on_free_ports(
            stack,
            *scale,
            *default_services(),
            "prometheus",
            port_vars=("JETSERVE_PROMETHEUS_PORT",),
        )
        stack.wait_gateway_ready()
        _warm_up(stack)
        yield stack, int(stack.env["JETSERVE_PROMETHEUS_PORT"])
    finally:
        if stack.http_port:
            stack.run("down", "-v", "--remove-orphans", "-t", "20")


def api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=5) as resp:
        return json.loads(resp.read())["data"]


def wait_all_up(port: int, expected: Counter[str]) -> list[dict[str, Any]]:
    """The active targets once there are ``expected`` per job, all up."""
    targets: list[dict[str, Any]] = []

    def all_up() -> list[dict[str, Any]] | None:
        nonlocal targets
        try:
            targets = api(port, "targets?state=active")["activeTargets"]
        except OSError:
            targets = []
        jobs = Counter(t["labels"]["job"] for t in targets)
        return targets if jobs == expected and all(t["health"] == "up" for t in targets) else None

    return eventually(
        all_up,
        timeout_s=TARGETS_TIMEOUT_S,
        interval_s=1,
        message=lambda: (
            "targets not all up: "
            + str(sorted((t["labels"]["job"], t["health"], t["lastError"]) for t in targets))
        ),
    )


def test_every_replica_of_every_service_is_scraped_and_up(
    observed: tuple[ComposeStack, int],
) -> None:
    _, port = observed
    jetserve = [name for name in default_services() if name != "nats"]
    expected = Counter({name: SCALED.get(name, 1) for name in jetserve})
    targets = wait_all_up(port, expected)
    seen = sorted((t["labels"]["job"], t["health"], t["lastError"]) for t in targets)
    print(f"[observability] targets: {seen}")
    assert Counter(t["labels"]["job"] for t in targets) == expected, seen
    assert {t["health"] for t in targets} == {"up"}, seen


def test_prometheus_sees_the_gateway_requests(observed: tuple[ComposeStack, int]) -> None:
    _, port = observed
    query = urllib.parse.quote('sum(jetserve_http_requests_total{endpoint="/v1/chat/completions"})')
    result: list[dict[str, Any]] = eventually(
        lambda: api(port, f"query?query={query}")["result"],
        timeout_s=30,
        interval_s=1,
        message="no jetserve_http_requests_total in Prometheus",
    )
    assert float(result[0]["value"][1]) >= 1


def test_every_dashboard_query_is_valid_promql(observed: tuple[ComposeStack, int]) -> None:
    """Prometheus answers every dashboard query (Grafana's ``$__rate_interval`` as 1m)."""
    _, port = observed
    failed = {}
    for title, expr in dashboard_exprs():
        query = urllib.parse.quote(expr.replace("$__rate_interval", "1m"))
        try:
            api(port, f"query?query={query}")
        except urllib.error.HTTPError as exc:
            failed[title] = exc.read().decode()
    assert failed == {}
