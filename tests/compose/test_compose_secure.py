"""Least privilege under docker compose (issue 12): ``jetserve nats-config --compose`` writes the
users and a compose file; with it nats-server admits only those keys, each worker is its own
service and identity, and chat and embeddings work with no permission violation logged."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from services.cli.secure import COMPOSE_NAME
from tests.compose.test_compose import ComposeStack, _warm_up, chat
from tests.support_containers import ROOT, compose_or_skip, up_on_free_ports

pytestmark = [pytest.mark.compose, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeStack]:
    compose = compose_or_skip()
    project = f"jssecure{uuid.uuid4().hex[:8]}"
    auth = tmp_path_factory.mktemp("auth") / "nats-auth"
    subprocess.run(
        [sys.executable, "-m", "services.cli", "nats-config", "--out", str(auth), "--compose",
         "--namespace", project, "--workers", "mocker=2", "--workers", "embedder=1",
         "--compose-file", str(ROOT / "docker-compose.yml")],
        check=True, cwd=ROOT,
    )  # fmt: skip
    env = {**os.environ, "JETSERVE_PUBLISH_ADDR": "127.0.0.1", "JETSERVE_NAMESPACE": project}
    stack = ComposeStack(compose, project, env, http_port=0, overrides=[auth / COMPOSE_NAME])
    try:
        up_on_free_ports(stack)
        stack.wait_gateway_ready()
        _warm_up(stack)
        yield stack
    finally:
        if stack.http_port:
            if os.environ.get("JETSERVE_COMPOSE_LOGS") == "1":
                print(stack.run("logs", "--no-color", "--tail", "40"))
            stack.run("down", "-v", "--remove-orphans", "-t", "20")


def test_every_worker_runs_as_its_own_user_and_requests_succeed(secure: ComposeStack) -> None:
    client = secure.client()
    outcomes = [chat(client, 0.0) for _ in range(6)]
    embedding = client.embeddings.create(model="Qwen/Qwen3-Embedding-0.6B", input="secure")
    assert [o.error for o in outcomes] == [""] * 6
    assert embedding.data[0].embedding
    assert secure.containers("mocker") == []  # the scalable service is off: one per identity
    assert len(secure.containers("mocker-0")) == len(secure.containers("mocker-1")) == 1
    logs = "".join(secure.logs(c) for c in secure.run("ps", "-q").split())
    assert "violation" not in logs.lower()


def test_the_server_admits_only_the_generated_keys(secure: ComposeStack) -> None:
    (gateway,) = secure.containers("gateway")
    # A client inside the project's network, without a key (nats-py, from the image).
    done = subprocess.run(
        ["docker", "exec", gateway, "python", "-c", NO_KEY_CLIENT],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "refused:" in done.stdout, done.stdout + done.stderr
    assert "authorization" in done.stdout.lower(), done.stdout


NO_KEY_CLIENT = """
import asyncio, nats
async def main():
    try:
        nc = await nats.connect("nats://nats:4222", allow_reconnect=False, connect_timeout=5)
    except Exception as exc:
        print("refused:", type(exc).__name__, exc)
    else:
        print("admitted")
        await nc.close()
asyncio.run(main())
"""
