"""Prometheus ``/metrics`` of the gateway, preprocessor and formatter after real requests; and
``nvext``: a pinned worker is echoed back in ``nvext.worker_id``, an unknown one is a 400
naming the header."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import openai
import pytest

from services.cli.stack import Stack, free_port
from tests.e2e.conftest import MODEL, start_stack
from tests.support import registered_cards

CHAT = [{"role": "user", "content": "Tell me about the sea."}]
ECHO_WORKER = {"nvext": {"extra_fields": ["worker_id"]}}


@pytest.fixture(scope="module")
def metrics_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """A stack whose preprocessor and formatter serve ``/metrics`` on ports of their own."""
    ports = {"preprocessor": free_port(), "formatter": free_port()}
    stack = start_stack(
        tmp_path_factory.mktemp("metrics"),
        model_dir,
        service_args={name: ["--metrics-port", str(port)] for name, port in ports.items()},
    )
    stack.metrics_ports = ports  # type: ignore[attr-defined]
    try:
        yield stack
    finally:
        stack.stop()


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    samples = {}
    for row in text.splitlines():
        if row and not row.startswith("#"):
            key, _, value = row.rpartition(" ")
            samples[key] = float(value)
    return samples


async def test_metrics_count_a_request_in_every_request_path_service(
    metrics_stack: Stack,
) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{metrics_stack.base_url}/v1", api_key="unused", max_retries=0
    )
    try:
        await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=4, extra_body={"n": 0}
            )
    finally:
        await client.close()
    ports: dict[str, int] = metrics_stack.metrics_ports  # type: ignore[attr-defined]
    gateway = _scrape(f"{metrics_stack.base_url}/metrics")
    pre = _scrape(f"http://127.0.0.1:{ports['preprocessor']}/metrics")
    fmt = _scrape(f"http://127.0.0.1:{ports['formatter']}/metrics")

    chat = 'endpoint="/v1/chat/completions"'
    assert gateway[f'jetserve_http_requests_total{{{chat},status="200"}}'] == 1
    assert gateway[f'jetserve_http_requests_total{{{chat},status="400"}}'] == 1
    assert gateway[f"jetserve_gateway_ttft_seconds_count{{{chat}}}"] == 1
    assert gateway[f"jetserve_http_request_seconds_count{{{chat}}}"] == 2
    assert gateway['jetserve_errors_total{code="invalid_request",service="gateway"}'] == 1
    assert gateway['jetserve_in_flight{service="gateway"}'] == 0
    assert pre['jetserve_messages_total{kind="preprocess",service="preprocessor"}'] == 1
    assert pre['jetserve_handler_seconds_count{kind="preprocess",service="preprocessor"}'] == 1
    assert pre['jetserve_in_flight{service="preprocessor"}'] == 0
    assert fmt['jetserve_messages_total{kind="stream_open",service="formatter"}'] == 1
    assert fmt['jetserve_messages_total{kind="stream",service="formatter"}'] >= 1
    assert fmt['jetserve_in_flight{service="formatter"}'] == 0


async def _worker_of(client: openai.AsyncOpenAI, **kwargs: Any) -> str:
    resp = await client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, extra_body=ECHO_WORKER, **kwargs
    )
    extra: dict[str, Any] = resp.model_extra or {}
    worker: str = extra["nvext"]["worker_id"]
    return worker


async def _live_workers(stack: Stack) -> list[str]:
    """Worker ids from the registry bucket (whatever the router mode)."""
    nc = await nats.connect(stack.nats_url)
    try:
        cards = await registered_cards(nc.jetstream(), stack.config.namespace)
        return sorted(c.worker_id for c in cards)
    finally:
        await nc.close()


async def test_pinned_worker_serves_and_is_echoed(stack: Stack, client: openai.AsyncOpenAI) -> None:
    workers = await _live_workers(stack)
    assert len(workers) == 2
    for worker in workers:
        pinned = {"x-worker-instance-id": worker}
        seen = {await _worker_of(client, extra_headers=pinned) for _ in range(3)}
        assert seen == {worker}


async def test_pinned_worker_is_echoed_on_the_final_stream_chunk(
    client: openai.AsyncOpenAI,
) -> None:
    worker = await _worker_of(client)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=3,
        stream=True,
        extra_body={"nvext": {"extra_fields": ["worker_id"], "backend_instance_id": worker}},
    )
    chunks = [c async for c in stream]
    echoed = [(c.model_extra or {}).get("nvext") for c in chunks]
    assert echoed[-1] == {"worker_id": worker}
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(e is None for e in echoed[:-1])


async def test_unknown_pinned_worker_is_400(client: openai.AsyncOpenAI) -> None:
    """Issue 24: a pin the registry cannot resolve is the client's mistake (400, the field
    named), not a missing resource; a known but dead worker is a 503."""
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=2,
            extra_headers={"x-worker-instance-id": "no-such-worker"},
        )
    assert "no-such-worker" in str(caught.value)


async def test_invalid_pinned_worker_is_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=2,
            extra_body={"nvext": {"backend_instance_id": "a.b"}},
        )
