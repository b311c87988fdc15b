"""docker-compose.yml and .env stay in step with the services' settings tables (no Docker)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from services.cli.config import SERVICES
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
    fixed = FIXED_IN_CONTAINER if service == "gateway" else set()
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
