"""docker-compose.yml and .env stay in step with the services' settings tables (no Docker)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from services.cli.config import SERVICES
from shared.config import CommonConfig
from tests.compose.knobs import COMMON, FIXED_IN_CONTAINER, PER_INSTANCE, knob_vars
from tests.support_containers import ROOT
from tools import env_file

BUS_SERVICES = ("preprocessor", "router", "formatter", "mocker")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


@pytest.fixture(scope="module")
def env_file_vars() -> set[str]:
    text = (ROOT / ".env").read_text()
    return set(re.findall(r"^#?([A-Z][A-Z0-9_]*)=", text, flags=re.MULTILINE))


def test_env_file_is_generated_from_the_tables() -> None:
    assert (ROOT / ".env").read_text() == env_file.render(), ".env is stale: make config-doc"


@pytest.mark.parametrize("service", SERVICES)
def test_env_file_documents_every_knob_of(service: str, env_file_vars: set[str]) -> None:
    assert sorted(set(knob_vars(service)) - env_file_vars) == []


@pytest.mark.parametrize("service", SERVICES)
def test_compose_passes_every_knob_to(service: str, compose: dict[str, Any]) -> None:
    environment = compose["services"][service]["environment"]
    fixed = {s.env for s in env_file.fixed_in_container(service)}
    assert sorted({*knob_vars(service), *fixed} - set(environment)) == []


@pytest.mark.parametrize("service", SERVICES)
def test_compose_sets_only_variables_the_service_reads(
    service: str, compose: dict[str, Any]
) -> None:
    known = {*knob_vars(service), *COMMON, *FIXED_IN_CONTAINER}
    extra = {"NATS_URL", "JETSERVE_HEALTH_NATS_MONITOR_URL"}  # read by jetserve-healthcheck
    environment = set(compose["services"][service]["environment"])
    assert sorted(environment - known - extra) == []


def test_compose_never_sets_instance_ids(compose: dict[str, Any]) -> None:
    set_ids = {
        (name, var)
        for name, svc in compose["services"].items()
        for var in svc.get("environment", {})
        if var in PER_INSTANCE
    }
    assert set_ids == set()


def test_every_service_runs_its_own_module_with_health_check_and_restart(
    compose: dict[str, Any],
) -> None:
    wrong = [
        name
        for name in SERVICES
        if compose["services"][name]["command"] != ["python", "-m", f"services.{name}"]
        or "test" not in compose["services"][name]["healthcheck"]
        or compose["services"][name]["restart"] != "unless-stopped"
        or compose["services"][name]["depends_on"] != {"nats": {"condition": "service_healthy"}}
    ]
    assert wrong == []


def test_scaled_services_have_no_fixed_name_or_host_port(compose: dict[str, Any]) -> None:
    fixed = [
        name
        for name in BUS_SERVICES
        if {"container_name", "ports"} & set(compose["services"][name])
    ]
    assert fixed == []


def test_nats_runs_jetstream_on_a_named_volume_with_a_health_check(
    compose: dict[str, Any],
) -> None:
    nats = compose["services"]["nats"]
    assert (
        nats["command"][:3],
        nats["volumes"],
        "healthz" in " ".join(nats["healthcheck"]["test"]),
    ) == (
        ["-js", "-sd", "/data"],
        ["nats-data:/data"],
        True,
    )


def test_common_env_reaches_every_service(compose: dict[str, Any]) -> None:
    missing = {
        name: sorted(set(COMMON) - set(compose["services"][name]["environment"]))
        for name in SERVICES
    }
    assert missing == {name: [] for name in SERVICES}


@pytest.fixture(scope="module")
def cluster_override() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.cluster.yml").read_text()))


CLUSTER_NODES = ("nats", "nats-2", "nats-3")
SEEDS = "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222"


def test_cluster_override_gives_every_service_all_seeds_and_three_replicas(
    cluster_override: dict[str, Any],
) -> None:
    wrong = {
        name: env
        for name in (*SERVICES, "echo_tensor")
        if (env := cluster_override["services"][name]["environment"])["JETSERVE_NATS_URL"] != SEEDS
        or env["NATS_URL"] != SEEDS
        or env["JETSERVE_JS_REPLICAS"] != "3"
        or env["JETSERVE_HEALTH_NATS_MONITOR_URL"].count(":8222") != 3
    }
    assert wrong == {}


def test_cluster_override_sets_only_variables_the_services_read(
    cluster_override: dict[str, Any],
) -> None:
    common = {s.env for s in CommonConfig.settings() if s.common}
    extra = {"NATS_URL", "JETSERVE_HEALTH_NATS_MONITOR_URL"}  # read by jetserve-healthcheck
    unknown = {
        var
        for name in (*SERVICES, "echo_tensor")
        for var in cluster_override["services"][name]["environment"]
        if var not in common | extra
    }
    assert unknown == set()


def test_cluster_nodes_are_distinct_jetstream_servers_routed_to_each_other(
    cluster_override: dict[str, Any],
) -> None:
    nodes = {name: cluster_override["services"][name] for name in CLUSTER_NODES}
    names = {n["command"][n["command"].index("--name") + 1] for n in nodes.values()}
    routes = {n["command"][n["command"].index("--routes") + 1] for n in nodes.values()}
    stores = {n["command"][n["command"].index("-sd") + 1] for n in nodes.values()}
    volumes = {v for name in CLUSTER_NODES[1:] for v in nodes[name]["volumes"] if ":/data" in v}
    assert (names, routes, stores, len(volumes)) == (
        {"nats-1", "nats-2", "nats-3"},
        {"nats://nats-1:6222,nats://nats-2:6222,nats://nats-3:6222"},
        {"/data"},
        2,  # nats-1 keeps the base file's nats-data
    )
