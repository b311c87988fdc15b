"""Generate ``.env`` (every Docker Compose knob, with its default) from the settings tables.

Written by ``python -m tools.config_doc --write`` together with ``docs/configuration.md``;
``tests/compose/test_env_file.py`` checks that the committed file is current and that
``docker-compose.yml`` passes every knob to its service.
"""

from __future__ import annotations

import functools
import textwrap

from services.cli.config import config_class, service_configs
from shared.config import CommonConfig, Setting

EXTRA_SERVICES = ("echo_tensor", "media", "vllm_worker", "hf_worker")
"""Services ``jetserve up`` does not run by default (test workers, real engines), documented and
in ``.env`` all the same; compose runs them under a profile (``vllm_worker``: ``gpu``)."""

COMPOSE_COMMON: dict[str, str] = {
    "nats_url": "nats://nats:4222",
    "namespace": "jetserve",
    "log_level": "INFO",
    "log_format": "json",
    "js_replicas": "1",
    "metrics_prefix": "jetserve_",
}
"""Settings every service shares, set once for all (``x-common-env``), with compose's values."""
METRICS_PORT = 8002
"""Where every bus service serves ``/metrics`` in compose (the gateway: on its HTTP port), as
Triton does beside 8000 / 8001; docker/prometheus/prometheus.yml scrapes it."""
METRICS_SERVICES = (
    "preprocessor", "router", "formatter", "mocker", "embedder", "echo_tensor", "media",
    "vllm_worker",
)  # fmt: skip
"""The compose services that serve ``/metrics`` on ``METRICS_PORT``."""
FIXED_IN_CONTAINER: dict[str, frozenset[str]] = {
    "gateway": frozenset({"http_host", "http_port", "grpc_port"}),
    **{name: frozenset({"metrics_port"}) for name in METRICS_SERVICES},
}
"""Set by the compose file itself (the container side of the published ports, the metrics port
Prometheus scrapes)."""

HEADER = """\
# JetServe on Docker Compose: every knob, with its default. Generated from the services'
# settings tables by `make config-doc` (python -m tools.config_doc --write): do not edit by
# hand; tests/compose/test_env_file.py fails when it is stale.
# docker compose reads this file for the ${...} in docker-compose.yml; a variable set in the
# shell wins over this file. Service knobs are commented out: unset (or empty) = the service's
# own default, which is the value shown (docs/configuration.md describes each).
# Instance ids (JETSERVE_GATEWAY_ID, JETSERVE_ROUTER_ID, JETSERVE_FORMATTER_ID,
# JETSERVE_MOCKER_WORKER_ID, JETSERVE_ECHO_TENSOR_WORKER_ID) are never set here: every scaled
# replica picks its own.

# --- compose ---
COMPOSE_PROJECT_NAME=jetserve
# Images. BASE_IMAGE is the build's base; `make images-local` builds stand-ins of these names
# on machines that cannot pull.
JETSERVE_IMAGE=jetserve:latest
BASE_IMAGE=python:3.11-slim
NATS_IMAGE=nats:2-alpine
# Host side of the gateway's published ports (the container side is always 8000 HTTP / 8001
# gRPC, KServe v2 / Triton).
JETSERVE_PUBLISH_ADDR=0.0.0.0
JETSERVE_HTTP_PORT=8000
JETSERVE_GRPC_PORT=8001
# `--profile observability`: Prometheus (built locally by `build_local_images.sh observability`
# where it cannot be pulled) and Grafana, on these host ports. Every bus service serves /metrics
# on port 8002 in its container (docs/operations.md, "Observability").
PROMETHEUS_IMAGE=prom/prometheus:v2.42.0
GRAFANA_IMAGE=grafana/grafana-oss:11.4.0
JETSERVE_PROMETHEUS_PORT=9090
JETSERVE_GRAFANA_PORT=3000
# Grafana's `admin` password (anonymous visitors may view the dashboards without one).
JETSERVE_GRAFANA_ADMIN_PASSWORD=admin
"""

HEALTH = """\
# NATS monitoring endpoint the health check asks whether a service has subscribed
# (empty = only check that the TCP connection to NATS is established)
JETSERVE_HEALTH_NATS_MONITOR_URL=http://nats:8222
"""


@functools.cache
def documented_configs() -> dict[str, type[CommonConfig]]:
    """Every service's config class: ``jetserve up``'s services, then ``EXTRA_SERVICES``."""
    return {**service_configs(), **{name: config_class(name) for name in EXTRA_SERVICES}}


def common_settings() -> list[Setting]:
    """The settings in ``x-common-env``: one value for every service."""
    table = CommonConfig.settings()
    return [table[name] for name in COMPOSE_COMMON]


def service_knobs(service: str) -> list[Setting]:
    """The settings of ``service`` that compose passes through from ``.env`` (or the shell)."""
    fixed = FIXED_IN_CONTAINER.get(service, frozenset())
    return [
        s
        for s in documented_configs()[service].settings()
        if not s.common and not s.per_instance and s.name not in fixed
    ]


def fixed_in_container(service: str) -> list[Setting]:
    fixed = FIXED_IN_CONTAINER.get(service, frozenset())
    return [s for s in documented_configs()[service].settings() if s.name in fixed]


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, width=98, initial_indent="# ", subsequent_indent="# ")


def render() -> str:
    """The whole ``.env``."""
    lines = [HEADER, "# --- every service ---"]
    for item in common_settings():
        lines += [*_comment(item.description()), f"{item.env}={COMPOSE_COMMON[item.name]}"]
    lines.append(HEALTH)
    for service in documented_configs():
        lines.append(f"# --- {service} ---")
        for item in service_knobs(service):
            lines += [*_comment(item.description()), f"#{item.env}={item.env_example()}"]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"
