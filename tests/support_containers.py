"""Docker for the tests: find (or start) an engine, build the local images, run NATS in a container.

Everything Docker-shaped that tests need goes through here, so the testcontainers API (whose NATS
module moved between versions) is touched in one place. Nothing here runs at import time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import pytest

from tests.support import free_port, in_ci, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "tests" / "compose" / "build_local_images.sh"
NATS_IMAGE = os.environ.get("JETSERVE_TEST_NATS_IMAGE", "nats:latest")


def _run(cmd: list[str], timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)


def engine_answers() -> bool:
    """True when ``docker info`` reaches an engine."""
    if shutil.which("docker") is None:
        return False
    try:
        return _run(["docker", "info"], timeout_s=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def may_provision() -> bool:
    """Whether tests may install docker.io, start dockerd and build images themselves.

    Yes in CI and with ``JETSERVE_DOCKER_PROVISION=1``; ``JETSERVE_DOCKER_PROVISION=0`` says no.
    """
    flag = os.environ.get("JETSERVE_DOCKER_PROVISION", "")
    return flag == "1" or (flag != "0" and in_ci())


def docker_unavailable_reason(*, images: bool = True) -> str | None:
    """``None`` when an engine answers (and, with ``images``, the local images are built).

    Otherwise the reason a Docker test must be skipped. Where provisioning is allowed this runs
    ``tests/compose/build_local_images.sh`` (cached: seconds after the first time).
    """
    if reason := os.environ.get("JETSERVE_DOCKER_SKIP_REASON"):
        return reason
    if os.environ.get("JETSERVE_DOCKER_READY") == "1" and engine_answers():
        return None
    if not engine_answers() and not may_provision():
        return (
            "no Docker engine ('docker info' failed); `make images-local` starts one "
            "(or set JETSERVE_DOCKER_PROVISION=1)"
        )
    if not images and engine_answers():
        return None
    try:
        done = _run(["bash", str(BUILD_SCRIPT), "all"], timeout_s=1200)
    except subprocess.TimeoutExpired:
        return f"{BUILD_SCRIPT.name} took more than 20 minutes"
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return f"no Docker engine could be started or images built: {tail}"
    return None


def build_local_image_or_skip(target: str) -> None:
    """``build_local_images.sh TARGET`` (an opt-in image such as ``prometheus``; seconds when it
    exists); the test is skipped, saying why, when it cannot be built."""
    if reason := docker_unavailable_reason(images=False):
        pytest.skip(reason)
    try:
        done = _run(["bash", str(BUILD_SCRIPT), target], timeout_s=900)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{BUILD_SCRIPT.name} {target} took more than 15 minutes")
    if done.returncode != 0:
        pytest.skip(f"could not build the {target} image: {done.stderr.strip()[-300:]}")


def compose_command() -> list[str] | None:
    """``docker compose`` (v2) where the plugin exists, else ``docker-compose`` (1.29), or None."""
    if shutil.which("docker") and _run(["docker", "compose", "version"]).returncode == 0:
        return ["docker", "compose"]
    if exe := shutil.which("docker-compose"):
        return [exe]
    return None


@contextmanager
def start_nats_container(
    image: str = NATS_IMAGE, *, network: str | None = None, ready_timeout_s: float = 30
) -> Iterator[str]:
    """Run ``nats-server -js`` in a container through testcontainers; yield its client URL.

    ``network`` is ``"bridge"`` (a published port the engine picks) or ``"host"`` (the host's
    network, on a port that was free a moment ago: for engines that cannot publish ports);
    default from ``JETSERVE_TEST_NATS_NETWORK``, else bridge. Ryuk (testcontainers' reaper,
    an image that cannot be pulled here) is off unless ``TESTCONTAINERS_RYUK_DISABLED`` says
    otherwise, so the container is stopped and removed here, by its own id.
    """
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    with warnings.catch_warnings():
        # Imported here: testcontainers reads its configuration (Ryuk above) at import time.
        # Its NATS module uses readiness helpers that testcontainers itself has deprecated.
        warnings.simplefilter("ignore", DeprecationWarning)
        from testcontainers.community.nats import NatsContainer

    network = network or os.environ.get("JETSERVE_TEST_NATS_NETWORK", "bridge")
    container = NatsContainer(image, jetstream=True, ready_timeout_secs=int(ready_timeout_s))
    if network == "host":
        port = free_port()
        container.ports.clear()
        container.with_kwargs(network_mode="host")
        container.with_command(f"-js -a 127.0.0.1 -p {port} -sd /tmp/jetstream")
    else:
        container.with_command("-js -sd /tmp/jetstream")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        container.start()
    try:
        if network == "host":
            wait_for_port(port, timeout_s=ready_timeout_s)
            yield f"nats://127.0.0.1:{port}"
        else:
            host, mapped = container.nats_host_and_port()
            deadline = time.monotonic() + ready_timeout_s
            wait_for_port(int(mapped), timeout_s=max(1.0, deadline - time.monotonic()))
            yield f"nats://{host}:{mapped}"
    finally:
        container.stop()


def compose_or_skip() -> list[str]:
    """The compose command; else the test is skipped, saying why (no engine, no compose)."""
    if reason := docker_unavailable_reason():
        pytest.skip(reason)
    compose = compose_command()
    if compose is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    return compose


class ComposeProject(Protocol):
    http_port: int
    env: dict[str, str]

    def run(self, *args: str, timeout_s: float = 300) -> str: ...


def up_on_free_ports(
    stack: ComposeProject, *args: str, attempts: int = 3, port_vars: tuple[str, ...] = ()
) -> None:
    """``up -d --no-build ARGS`` with the gateway (and each host port in ``port_vars``, such as
    ``JETSERVE_PROMETHEUS_PORT``) on free host ports (``http_port`` is set). Ports are only free
    until someone takes them: on a clash, other ones."""
    for attempt in range(attempts):
        stack.http_port = free_port()
        stack.env["JETSERVE_HTTP_PORT"] = str(stack.http_port)
        for var in ("JETSERVE_GRPC_PORT", *port_vars):
            stack.env[var] = str(free_port())
        try:
            stack.run("up", "-d", "--no-build", *args)
            return
        except RuntimeError as exc:
            if attempt == attempts - 1 or "address already in use" not in str(exc):
                raise
