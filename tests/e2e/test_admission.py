"""Admission through the whole stack (issue 26): budgets across gateways and routers, priority
under overload, the queue's bound. Real processes, real clients (``openai``, ``anthropic``).

The stacks run two routers; a second gateway is started beside the launcher's, on the same bus
and policy file, as a second deployment of the gateway would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from services.cli.stack import Stack, admission_env, free_port
from tests.e2e.conftest import MODEL, running_stack
from tests.support import eventually

pytestmark = pytest.mark.timeout(180)

POLICY = """\
default_class: regular
class_header: true
classes:
  premium: {weight: 4}
  regular: {weight: 1}
tenants:
  small: {tokens_per_minute: 400}
  big: {tokens_per_minute: 10000000}
"""


def _policy(tmp_path: Path) -> Path:
    path = tmp_path / "admission.yaml"
    path.write_text(POLICY)
    return path


class SecondGateway:
    """``python -m services.gateway`` on the stack's bus, its own ports."""

    def __init__(self, stack: Stack, log: Path) -> None:
        self.http_port, grpc_port = free_port(), free_port()
        env = {
            **os.environ,
            "JETSERVE_NATS_URL": stack.nats_url,
            "JETSERVE_NAMESPACE": stack.config.namespace,
            **admission_env(stack.config.admission_config),
        }
        cmd = [sys.executable, "-m", "services.gateway", "--http-port", str(self.http_port)]
        cmd += ["--grpc-port", str(grpc_port)]
        self._log = log.open("ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.base_url = f"http://127.0.0.1:{self.http_port}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{self.base_url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(healthy, timeout_s=60, interval_s=0.2, message="the second gateway is not up")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


@pytest.fixture(scope="module")
def budget_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("budgets")
    with running_stack(run_dir, model_dir, routers=2, admission_config=_policy(run_dir)) as s:
        yield s


@pytest.fixture(scope="module")
def second_gateway(budget_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    gateway = SecondGateway(budget_stack, tmp_path_factory.mktemp("gw2") / "gateway2.log")
    try:
        yield gateway.base_url
    finally:
        gateway.stop()


def _client(base_url: str, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base_url}/v1",
        api_key="none",
        max_retries=0,
        timeout=30,
        default_headers={"x-tenant-id": tenant},
    )


def _ask(client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "spend some tokens"}], max_tokens=64
    )


def test_a_tenant_over_its_budget_gets_429_everywhere_another_tenant_does_not(
    budget_stack: Stack, second_gateway: str
) -> None:
    first = _client(budget_stack.base_url, "small")
    refused: openai.RateLimitError | None = None
    for _ in range(10):  # ~80 tokens each: the fifth or so is over 400
        try:
            _ask(first)
        except openai.RateLimitError as exc:
            refused = exc
            break
    assert refused is not None, "tenant small was never refused"
    assert refused.status_code == 429
    body = refused.body
    assert isinstance(body, dict)
    assert body["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.response.headers["retry-after"]) <= 61
    # The other gateway (and whichever router takes it) refuses the same tenant ...
    with pytest.raises(openai.RateLimitError):
        _ask(_client(second_gateway, "small"))
    # ... in the Messages API's dialect too ...
    claude = anthropic.Anthropic(
        base_url=second_gateway,
        api_key="none",
        max_retries=0,
        default_headers={"x-tenant-id": "small"},
    )
    with pytest.raises(anthropic.RateLimitError) as caught:
        claude.messages.create(
            model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    # ... and another tenant is served through both.
    for base_url in (budget_stack.base_url, second_gateway):
        _ask(_client(base_url, "big"))


def test_an_unknown_policy_class_is_a_400_naming_the_header(budget_stack: Stack) -> None:
    client = _client(budget_stack.base_url, "big")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            extra_headers={"x-dynamo-meta-policy-class": "gold"},
        )
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["param"] == "x-dynamo-meta-policy-class"


# --- overload ------------------------------------------------------------------------------------
BUSY_WHILE_PREFILLING = ["--active-prefill-tokens-threshold", "0"]
"""A worker is busy while any request routed there is in prefill: under a burst, most wait."""


@contextlib.contextmanager
def _overloaded(
    tmp_path: Path, model_dir: Path, *router_args: str, routers: int = 1, timeout_s: float
) -> Iterator[tuple[Stack, openai.AsyncOpenAI]]:
    """One slow worker, busy while it prefills, behind ``routers`` routers; an async client
    whose requests time out after ``timeout_s`` (a hang fails the test)."""
    with running_stack(
        tmp_path,
        model_dir,
        workers=1,
        routers=routers,
        mocker_args="--speedup-ratio 0.2 --seed 1",
        service_args={"router": [*BUSY_WHILE_PREFILLING, *router_args]},
    ) as stack:
        yield (
            stack,
            openai.AsyncOpenAI(
                base_url=f"{stack.base_url}/v1", api_key="none", max_retries=0, timeout=120
            ),
        )


def _long_prompt(tag: str) -> str:
    """A prompt whose prefill takes a while at speedup 0.2 (unique by ``tag``: nothing cached)."""
    return " ".join(f"{tag}w{j}" for j in range(300))


async def _ttft(client: openai.AsyncOpenAI, priority: float, prompt: str) -> float:
    started = time.monotonic()
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=2,
        stream=True,
        extra_headers={"x-dynamo-request-priority": str(priority)},
    )
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic() - started
    assert first is not None
    return first


async def _answer(client: openai.AsyncOpenAI, prompt: str) -> tuple[int, str | None]:
    """The status of one chat completion, and its ``Retry-After`` when refused."""
    try:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=2
        )
    except openai.APIStatusError as exc:
        return exc.status_code, exc.response.headers.get("retry-after")
    return 200, None


def test_under_overload_high_priority_gets_its_first_token_sooner(
    tmp_path: Path, model_dir: Path
) -> None:
    with _overloaded(tmp_path, model_dir, timeout_s=120) as (_, client):

        async def burst() -> tuple[list[float], list[float]]:
            tasks = []
            for i in range(16):  # alternate, so neither kind arrives first
                tasks.append(_ttft(client, 0, f"low {i} {_long_prompt('')}"))
                tasks.append(_ttft(client, 60, f"high {i} {_long_prompt('')}"))
            ttfts = await asyncio.gather(*tasks)
            return list(ttfts[0::2]), list(ttfts[1::2])

        low, high = asyncio.run(burst())
    print(f"TTFT p50: high {statistics.median(high):.3f} s, low {statistics.median(low):.3f} s")
    assert statistics.median(high) < statistics.median(low)


def test_past_the_queue_bound_requests_get_529_and_none_hangs(
    tmp_path: Path, model_dir: Path
) -> None:
    with _overloaded(tmp_path, model_dir, "--queue-max-length", "2", timeout_s=60) as (_, client):

        async def flood() -> list[tuple[int, str | None]]:
            return await asyncio.gather(
                *(_answer(client, _long_prompt(f"x{i}")) for i in range(12))
            )

        answers = asyncio.run(flood())
    statuses = [status for status, _ in answers]
    assert set(statuses) <= {200, 529}, answers
    assert all(retry is not None for status, retry in answers if status == 529), answers
    assert statuses.count(529) >= 1
    assert statuses.count(200) >= 3  # one routed at once, then the queued ones in turn


def test_a_router_killed_with_requests_in_its_queue_loses_none(
    tmp_path: Path, model_dir: Path
) -> None:
    """Its queued requests are known to the fleet while it lives (its backlog records name
    them); once it is gone, the formatters find them unrouted and submit them again."""
    with _overloaded(tmp_path, model_dir, routers=2, timeout_s=90) as (stack, client):

        async def flood_and_kill() -> list[tuple[int, str | None]]:
            tasks = [asyncio.create_task(_answer(client, _long_prompt(f"k{i}"))) for i in range(12)]
            await asyncio.sleep(1.5)  # both routers hold queued requests by now
            router = next(c for c in stack.children if c.name.startswith("router"))
            os.kill(router.proc.pid, signal.SIGKILL)
            return await asyncio.gather(*tasks)

        answers = asyncio.run(flood_and_kill())
    assert [status for status, _ in answers] == [200] * 12, answers
