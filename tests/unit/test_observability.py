"""The observability profile's files agree with docker-compose.yml (no Docker, no sockets).

Every service of the compose file that serves ``/metrics`` has a Prometheus job on its DNS name
and port, and every dashboard query names metrics; ``tests/e2e/test_dashboard_metrics.py``
checks those names against what the running services export.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.observability import (
    DASHBOARD,
    DATASOURCE,
    dashboard,
    dashboard_exprs,
    metric_names,
    scrape_jobs,
)
from tests.support_containers import ROOT
from tools.env_file import METRICS_PORT

NOT_JETSERVE = {"vllm": 8000}
"""Services of the compose file that are not JetServe's but serve ``/metrics`` (vLLM's own
server, on its API port)."""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def metrics_ports(compose: dict[str, Any]) -> dict[str, int]:
    """Compose service -> the port its ``/metrics`` is served on in its container."""
    ports = dict(NOT_JETSERVE)
    for name, service in compose["services"].items():
        env = service.get("environment", {})
        if name == "gateway":
            ports[name] = int(env["JETSERVE_GATEWAY_HTTP_PORT"])
        elif port := next((v for k, v in env.items() if k.endswith("_METRICS_PORT")), None):
            ports[name] = int(port)
    return ports


def test_metric_names_leave_out_functions_labels_keywords_and_numbers() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, worker_id) (rate(a_bucket{x="b(c)"}[$__rate_interval'
        "]))) / on (job) group_left b:rec or vector(0) > bool 1e3 unless c offset 5m"
    )
    assert metric_names(expr) == {"a_bucket", "b:rec", "c"}


def test_every_jetserve_service_serves_metrics(compose: dict[str, Any]) -> None:
    jetserve = {
        name
        for name, svc in compose["services"].items()
        if svc.get("command", [])[:2] == ["python", "-m"]
    }
    ports = metrics_ports(compose)
    assert sorted(jetserve - set(ports)) == []
    assert {ports[name] for name in jetserve - {"gateway"}} == {METRICS_PORT}


def test_prometheus_scrapes_every_service_that_serves_metrics(compose: dict[str, Any]) -> None:
    jobs = scrape_jobs()
    assert {job: name for job, (name, _) in jobs.items()} == {name: name for name in jobs}
    assert dict(jobs.values()) == metrics_ports(compose)


def test_every_dashboard_query_names_a_metric() -> None:
    empty = [title for title, expr in dashboard_exprs() if not metric_names(expr)]
    assert empty == []


def test_dashboard_panels_use_the_provisioned_datasource() -> None:
    (source,) = yaml.safe_load(DATASOURCE.read_text())["datasources"]
    uids = {p["datasource"]["uid"] for p in dashboard()["panels"] if "datasource" in p}
    assert uids == {source["uid"]}


def test_grafana_loads_the_dashboard_from_where_compose_mounts_it(
    compose: dict[str, Any],
) -> None:
    """Grafana cannot run here: its paths are checked instead (provider, home page, mounts)."""
    grafana = compose["services"]["grafana"]
    mounts = dict(v.removesuffix(":ro").split(":", 1) for v in grafana["volumes"])
    provider = ROOT / "docker" / "grafana" / "provisioning" / "dashboards" / "jetserve.yml"
    (files,) = yaml.safe_load(provider.read_text())["providers"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert mounts["./docker/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./docker/grafana/dashboards"] == files["options"]["path"]
    assert home == f"{files['options']['path']}/{DASHBOARD.name}"
