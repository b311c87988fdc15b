"""docker-compose.yml's disaggregated serving: the ``prefill`` and ``decode`` services are the
mocker with a role, under the ``disagg`` profile (the default stack is unchanged), scalable with
``--scale``, and the cluster override reaches them. The file as YAML (no Docker), then as compose
itself resolves it (``config``: no engine, no image)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
import yaml

from tests.support_containers import ROOT, compose_command

ROLES = {"prefill": "prefill", "decode": "decode"}
"""Compose service → the ``JETSERVE_MOCKER_ROLE`` it sets."""
ROLE = "JETSERVE_MOCKER_ROLE"


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"])


@pytest.mark.parametrize("name", ROLES)
def test_each_role_is_the_mocker_with_its_role_under_the_disagg_profile(
    name: str, services: dict[str, Any]
) -> None:
    mocker, service = services["mocker"], services[name]
    assert service["profiles"] == ["disagg"]
    assert service["environment"] == {**mocker["environment"], ROLE: ROLES[name]}
    same = {k: v for k, v in service.items() if k not in ("profiles", "environment")}
    assert same == {k: v for k, v in mocker.items() if k != "environment"}


def test_the_default_stack_keeps_aggregated_mockers_only(services: dict[str, Any]) -> None:
    assert "profiles" not in services["mocker"]
    assert services["mocker"]["environment"][ROLE] == "${JETSERVE_MOCKER_ROLE:-}"  # both


@pytest.mark.parametrize("name", ROLES)
def test_role_services_scale_freely(name: str, services: dict[str, Any]) -> None:
    """``--scale prefill=2``: no fixed container name, no host port."""
    assert {"container_name", "ports", "hostname"} & set(services[name]) == set()


@pytest.mark.parametrize("name", ROLES)
def test_the_cluster_override_gives_role_services_every_seed(name: str) -> None:
    override = yaml.safe_load((ROOT / "docker-compose.cluster.yml").read_text())["services"]
    assert override[name] == override["mocker"]


def _config(*args: str) -> dict[str, Any]:
    """What compose makes of the files with ``args`` (``--profile``…): ``config``, no engine."""
    compose = compose_command()
    if compose is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JETSERVE_", "COMPOSE_"))}
    done = subprocess.run(
        [*compose, "-p", "jsdisaggconfig", *args, "config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return dict(yaml.safe_load(done.stdout)["services"])


def test_compose_resolves_the_role_of_each_service_with_the_profile() -> None:
    resolved = _config("--profile", "disagg")
    roles = {name: resolved[name]["environment"][ROLE] for name in ("mocker", *ROLES)}
    assert roles == {"mocker": "", "prefill": "prefill", "decode": "decode"}  # "": both
    assert {name: resolved[name].get("profiles") for name in ROLES} == {
        name: ["disagg"] for name in ROLES
    }
    assert {tuple(resolved[name]["command"]) for name in ("mocker", *ROLES)} == {
        ("python", "-m", "services.mocker")
    }


def test_compose_resolves_role_services_on_the_nats_cluster() -> None:
    files = ("-f", "docker-compose.yml", "-f", "docker-compose.cluster.yml")
    resolved = _config(*files, "--profile", "disagg")
    seeds = "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222"
    for name in ROLES:
        env = resolved[name]["environment"]
        assert (env["JETSERVE_NATS_URL"], env[ROLE]) == (seeds, ROLES[name])
        assert set(resolved[name]["depends_on"]) == {"nats", "nats-2", "nats-3"}
