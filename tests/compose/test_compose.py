"""docker-compose.yml end to end: up, chat through the gateway, scale, kill a worker, down -v.

Skipped, with the reason, where no Docker engine can be had (see ``tests/support_containers``).
The stack runs as its own compose project with the gateway on a free host port; teardown checks
that ``down -v`` left no container, network or volume of that project behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from tests.support import eventually
from tests.support_containers import ROOT, compose_or_skip, up_on_free_ports

pytestmark = [pytest.mark.compose, pytest.mark.timeout(900)]

MODEL = "Qwen/Qwen3-0.6B"
READY_TIMEOUT_S = 120.0
GRACE_S = 1.0


@dataclass
class ComposeStack:
    """One compose project: run compose commands against it, read its containers' logs."""

    compose: list[str]
    project: str
    env: dict[str, str]
    http_port: int
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    overrides: list[Path] = field(default_factory=list)
    """Compose files added after docker-compose.yml (``-f``)."""

    def run(self, *args: str, timeout_s: float = 300) -> str:
        files = [ROOT / "docker-compose.yml", *self.overrides]
        cmd = [*self.compose, "-p", self.project, *(f for p in files for f in ("-f", str(p)))]
        cmd += args
        done = subprocess.run(
            cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout_s
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout

    def containers(self, service: str) -> list[str]:
        return self.run("ps", "-q", service).split()

    def logs(self, container: str) -> str:
        done = subprocess.run(
            ["docker", "logs", container], capture_output=True, text=True, timeout=30, check=False
        )
        return done.stdout + done.stderr

    def wait_healthy(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every container of the project reports ``healthy`` (Docker's health checks)."""
        states: list[str] = []

        def healthy() -> bool:
            nonlocal states
            ids = self.run("ps", "-q").split()
            states = subprocess.run(
                ["docker", "inspect", "-f", "{{.Name}} {{.State.Health.Status}}", *ids],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.split("\n")
            return bool(ids) and all(s.endswith(" healthy") for s in states if s)

        eventually(
            healthy, timeout_s=timeout_s, interval_s=1, message=lambda: f"not healthy: {states}"
        )

    def wait_gateway_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until ``/health`` is 200: a model has a live worker."""

        def ready() -> bool:
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=2) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False

        eventually(ready, timeout_s=timeout_s, interval_s=0.5, message="gateway /health not 200")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def client(self) -> openai.OpenAI:
        # No client retries: a failure must show, not be retried away.
        return openai.OpenAI(base_url=self.url("/v1"), api_key="unused", max_retries=0, timeout=30)


@dataclass
class Outcome:
    request_id: str
    started_s: float
    ended_s: float
    error: str = ""


def chat(client: openai.OpenAI, t0: float, max_tokens: int = 16) -> Outcome:
    """One streamed chat request; its request id (from the chunk id), timing and any error."""
    started = time.monotonic() - t0
    request_id = ""
    try:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Say something {uuid.uuid4().hex[:6]}"}],
            max_tokens=max_tokens,
            stream=True,
        )
        finish = None
        for chunk in stream:
            request_id = chunk.id.removeprefix("chatcmpl-")
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        error = "" if finish == "length" else f"finish_reason={finish}"
    except openai.APIError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return Outcome(request_id, started, time.monotonic() - t0, error)


def served_by(stack: ComposeStack, service: str, request_ids: list[str]) -> Counter[str]:
    """How many of ``request_ids`` each container of ``service`` logged (short container id)."""
    counts: Counter[str] = Counter()
    for cid in stack.containers(service):
        log = stack.logs(cid)
        counts[cid[:12]] = sum(1 for rid in request_ids if rid and rid in log)
    return counts


@pytest.fixture(scope="module")
def stack(pytestconfig: pytest.Config) -> Iterator[ComposeStack]:
    t0 = time.monotonic()
    compose = compose_or_skip()
    images_s = time.monotonic() - t0
    project = f"jstest{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "JETSERVE_PUBLISH_ADDR": "127.0.0.1",
        "JETSERVE_NAMESPACE": project,
        # Which replica served a request is read from the per-hop log lines, which are DEBUG.
        "JETSERVE_LOG_LEVEL": "DEBUG",
        # Real (simulated) timing, so requests are in flight when a worker is killed; a short
        # formatter idle timeout bounds what a request on the killed worker waits.
        "JETSERVE_MOCKER_SPEEDUP_RATIO": "1",
        "JETSERVE_FORMATTER_IDLE_TIMEOUT_S": "5",
        "JETSERVE_GATEWAY_WORKER_TTL_S": "3",
        "JETSERVE_ROUTER_WORKER_TTL_S": "3",
        "JETSERVE_MOCKER_WORKER_TTL_S": "3",
    }
    stack = ComposeStack(compose, project, env, http_port=0)
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    try:
        t1 = time.monotonic()
        up_on_free_ports(stack)
        stack.wait_gateway_ready()
        up_s = time.monotonic() - t1
        stack.wait_healthy()
        healthy_s = time.monotonic() - t1
        cold_failures = _warm_up(stack)
        stack.timings.update(
            images_s=images_s,
            up_ready_s=up_s,
            up_healthy_s=healthy_s,
            first_ok_request_s=time.monotonic() - t1,
        )
        stack.notes.append(f"{cold_failures} request(s) failed before the first success")
        yield stack
    finally:
        if stack.http_port:
            _dump_logs_on_failure(stack)
            # Idempotent: the last test already did this; here it covers failures.
            stack.run("down", "-v", "--remove-orphans", "-t", "20")
        with capture.global_and_fixture_disabled():
            print()
            for key, value in stack.timings.items():
                print(f"[compose timing] {key} = {value:.1f}s")
            for note in stack.notes:
                print(f"[compose] {note}")


def _warm_up(stack: ComposeStack, timeout_s: float = 60) -> int:
    """Send requests until one succeeds; return how many failed first.

    The first request loads the model's tokenizer in the preprocessor and the formatter; on a
    busy machine that can outlast the preprocessor's 2 s formatter timeout (a 504).
    """
    client = stack.client()
    deadline = time.monotonic() + timeout_s
    failures = 0
    while time.monotonic() < deadline:
        if not chat(client, time.monotonic(), max_tokens=2).error:
            return failures
        failures += 1
    raise TimeoutError(f"no request succeeded within {timeout_s:.0f}s of the stack being healthy")


def _dump_logs_on_failure(stack: ComposeStack) -> None:
    if os.environ.get("JETSERVE_COMPOSE_LOGS") == "1":
        print(stack.run("logs", "--no-color", "--tail", "40"))


def test_chat_requests_succeed_through_the_compose_stack(stack: ComposeStack) -> None:
    client = stack.client()
    t0 = time.monotonic()
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    streamed = chat(client, t0)
    assert (reply.choices[0].finish_reason, reply.usage and reply.usage.completion_tokens) == (
        "length",
        8,
    )
    assert streamed.error == ""


def test_scaled_routers_and_mockers_all_take_requests(stack: ComposeStack) -> None:
    t0 = time.monotonic()
    stack.run("up", "-d", "--no-build", "--scale", "router=2", "--scale", "mocker=4",
              "--scale", "formatter=2")  # fmt: skip
    stack.wait_healthy()
    stack.timings["scale_s"] = time.monotonic() - t0
    client = stack.client()
    outcomes: list[Outcome] = []
    ids: list[str] = []
    # New workers appear to routers as their cards land: send until all four have served.
    deadline = time.monotonic() + 60
    with ThreadPoolExecutor(8) as pool:
        while time.monotonic() < deadline:
            outcomes += pool.map(lambda _: chat(client, t0), range(16))
            ids = [o.request_id for o in outcomes]
            mockers = served_by(stack, "mocker", ids)
            if len(outcomes) >= 32 and len(mockers) == 4 and min(mockers.values()) > 0:
                break
    routers = served_by(stack, "router", ids)
    formatters = served_by(stack, "formatter", ids)
    stack.notes.append(f"{len(outcomes)} requests after scaling; mockers {dict(mockers)}; routers "
          f"{dict(routers)}; formatters {dict(formatters)}")  # fmt: skip
    assert [o.error for o in outcomes if o.error] == []
    assert sorted(c > 0 for c in [*mockers.values(), *routers.values()]) == [True] * 6


def crash(container: str) -> str:
    """SIGKILL the container's main process from the host, as a crash would; else ``docker kill``.

    A crash is what the restart policy is for (``docker kill`` counts as a manual stop, which
    ``unless-stopped`` respects). The process is visible only where the engine shares our pid
    namespace (a local dockerd run as root).
    """
    pid = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Pid}}", container],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    cmdline = Path(f"/proc/{pid}/cmdline")
    if os.geteuid() == 0 and cmdline.is_file() and b"services.mocker" in cmdline.read_bytes():
        os.kill(int(pid), signal.SIGKILL)
        return "crashed"
    subprocess.run(["docker", "kill", container], check=True, capture_output=True, timeout=30)
    return "docker kill"


def wait_restarted(container: str, timeout_s: float = 60) -> str:
    """The container's state once the restart policy has brought it back."""
    state = ""

    def restarted() -> str | None:
        nonlocal state
        state = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Status}} restarts={{.RestartCount}}", container],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        return state if state.startswith("running") and not state.endswith("restarts=0") else None

    return eventually(
        restarted,
        timeout_s=timeout_s,
        interval_s=0.5,
        message=lambda: f"{container} was not restarted: {state}",
    )


def test_killing_a_mocker_mid_run_keeps_requests_succeeding(stack: ComposeStack) -> None:
    client = stack.client()
    victim = stack.containers("mocker")[0]
    t0 = time.monotonic()
    kill_at_s, run_for_s = 3.0, 12.0
    outcomes: list[Outcome] = []

    def loop() -> None:
        while time.monotonic() - t0 < run_for_s:
            outcomes.append(chat(client, t0, max_tokens=32))

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(loop) for _ in range(6)]
        time.sleep(kill_at_s)
        how = crash(victim)
        killed_s = time.monotonic() - t0
        for f in futures:
            f.result()
    restarted = wait_restarted(victim, timeout_s=60 if how == "crashed" else 0)
    # Until NATS sees the dead connection close (milliseconds), a request routed to it is lost
    # like one that was running there; a grace of 1 s covers that.
    in_flight = [o for o in outcomes if o.started_s <= killed_s + GRACE_S and o.ended_s > killed_s]
    after = [o for o in outcomes if o.started_s > killed_s + GRACE_S]
    failed = [o for o in outcomes if o.error]
    errors = sorted({f"{o.started_s:.2f}s {o.error[:60]}" for o in failed})
    stack.notes.append(
        f"mocker {victim[:12]} {how} at {killed_s:.2f}s: {len(outcomes)} requests, "
        f"{len(in_flight)} in flight, {len(after)} started after, {len(failed)} failed "
        f"{errors}; then the container was: {restarted}"
    )
    # Requests started after the kill must all succeed: routers skip the dead worker (no
    # responders -> retry on another) until its card expires. A request that was streaming on
    # it when it died may fail (there is no mid-stream migration yet).
    assert [o for o in after if o.error] == []
    assert [o for o in failed if o not in in_flight] == []
    assert len(after) >= 10
    if how == "crashed":
        assert restarted.startswith("running")


def test_down_leaves_no_state(stack: ComposeStack) -> None:
    """``down -v`` removes every container, network and volume of the project (by label)."""
    t0 = time.monotonic()
    stack.run("down", "-v", "--remove-orphans", "-t", "20")
    stack.timings["down_s"] = time.monotonic() - t0
    label = f"label=com.docker.compose.project={stack.project}"
    left = {
        kind: subprocess.run(
            ["docker", kind, "ls", "-q", "--filter", label]
            + (["-a"] if kind == "container" else []),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for kind in ("container", "network", "volume")
    }
    assert left == {"container": [], "network": [], "volume": []}
