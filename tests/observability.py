"""The observability profile's files, read for tests: the dashboard's PromQL, the scrape jobs.

``metric_names(expr)`` finds the metric names a PromQL expression selects; ``exported_names``
the sample names a ``/metrics`` text can produce (a histogram family ``x`` gives ``x_bucket``,
``x_sum``, ``x_count``), so the dashboard is checked against what the services really serve.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support_containers import ROOT

DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "jetserve-fleet.json"
DATASOURCE = ROOT / "docker" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROMETHEUS_CONFIG = ROOT / "docker" / "prometheus" / "prometheus.yml"
PROMETHEUS_OWN = frozenset({"up"})
"""Series Prometheus writes itself for every target."""

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLES = re.compile(r"\$\w+")
_IDENTIFIER = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "offset", "bool", "inf", "nan", "group_left", "group_right"}
)
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: not functions, labels, keywords or numbers."""
    for pattern in (_STRINGS, _MATCHERS, _RANGES, _GROUPING, _VARIABLES):
        expr = pattern.sub(" ", expr)
    return {name for name in _IDENTIFIER.findall(expr) if name.lower() not in _KEYWORDS}


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    """``(panel title, expr)`` for every query of every panel."""
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def exported_names(exposition: str) -> set[str]:
    """Every sample name the families of a ``/metrics`` text produce, whether or not a
    labelled child has been created yet (a counter with labels has no sample until then)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def scrape_jobs() -> dict[str, tuple[str, int]]:
    """Prometheus job name -> (the DNS name it resolves, the port it scrapes)."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {}
    for job in config["scrape_configs"]:
        (sd,) = job["dns_sd_configs"]
        (name,) = sd["names"]
        jobs[job["job_name"]] = (name, int(sd["port"]))
    return jobs
