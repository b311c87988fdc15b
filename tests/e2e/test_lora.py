"""LoRA adapters end to end (decision 031): ``--lora-modules`` on every worker, ``/v1/models``
listing each adapter with its ``parent``, requests routed only to holders, vLLM's load/unload
endpoints at run time, an unknown adapter's 404, and the router placing a hot adapter on a
second worker. Real processes, the real openai SDK; outcomes are asserted, never timings."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import openai
import pytest

from services.cli.stack import Stack
from shared.messages import WorkerCard
from tests.e2e.conftest import MODEL, start_stack
from tests.e2e.test_launcher import _start_up, _up_line
from tests.support import eventually_awaited, registered_cards

WORKER_ID = {"nvext": {"extra_fields": ["worker_id"]}}
ADAPTERS = "sql=/adapters/sql chat=/adapters/chat"


@pytest.fixture(scope="module")
def lora_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    s = start_stack(
        tmp_path_factory.mktemp("lora"),
        model_dir,
        router_mode="kv",
        lora_modules=ADAPTERS,
        mocker_args="--speedup-ratio 0 --seed 1 --max-loras 2",
        service_args={"router": ["--no-lora-placement"]},
    )
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
async def client(lora_stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{lora_stack.base_url}/v1", api_key="unused", max_retries=0
    ) as c:
        yield c


async def _cards(stack: Stack) -> list[WorkerCard]:
    nc = await nats.connect(stack.nats_url)
    try:
        return await registered_cards(nc.jetstream(), stack.config.namespace)
    finally:
        await nc.close()


def _admin(stack: Stack, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{stack.base_url}{path}", json=body, timeout=30)


async def _served_by(client: openai.AsyncOpenAI, model: str, n: int) -> set[str]:
    workers = set()
    for i in range(n):
        response = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"question {i}"}],
            max_tokens=2,
            extra_body=WORKER_ID,
        )
        assert response.model == model  # the answer names the adapter, as vLLM's do
        workers.add((response.model_extra or {})["nvext"]["worker_id"])
    return workers


async def test_models_lists_each_adapter_with_its_parent(client: openai.AsyncOpenAI) -> None:
    listed = {m.id: m for m in (await client.models.list()).data}
    assert {"sql", "chat", MODEL} <= set(listed)
    sql = listed["sql"].model_extra or {}
    assert sql["parent"] == MODEL
    assert sql["root"] == "/adapters/sql"
    assert (listed[MODEL].model_extra or {})["parent"] is None


async def test_every_worker_card_lists_the_adapters_it_holds(lora_stack: Stack) -> None:
    cards = await _cards(lora_stack)
    assert len(cards) == 2
    for card in cards:
        assert {a.name for a in card.loras} >= {"sql", "chat"}
        assert card.max_loras == 2


async def test_an_unknown_adapter_is_a_404_with_openai_error_body(
    client: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(
            model="no-such-adapter", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]


async def test_run_time_load_routes_to_its_holder_and_unload_removes_it(
    lora_stack: Stack, client: openai.AsyncOpenAI
) -> None:
    cards = await _cards(lora_stack)
    holder = sorted(c.worker_id for c in cards)[0]
    loaded = _admin(
        lora_stack,
        "/v1/load_lora_adapter",
        {"lora_name": "fresh", "lora_path": "/adapters/fresh", "worker_ids": [holder]},
    )
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == "Success: LoRA adapter 'fresh' added successfully."
    again = _admin(
        lora_stack, "/v1/load_lora_adapter", {"lora_name": "fresh", "lora_path": "/adapters/fresh"}
    )
    assert again.status_code == 200  # the other worker had not loaded it yet
    twice = _admin(
        lora_stack, "/v1/load_lora_adapter", {"lora_name": "fresh", "lora_path": "/adapters/fresh"}
    )
    assert twice.status_code == 400
    assert "already been loaded" in twice.json()["error"]["message"]
    dropped = _admin(
        lora_stack,
        "/v1/unload_lora_adapter",
        {"lora_name": "fresh", "worker_ids": [c.worker_id for c in cards if c.worker_id != holder]},
    )
    assert dropped.status_code == 200, dropped.text
    assert await _served_by(client, "fresh", 6) == {holder}
    gone = _admin(lora_stack, "/v1/unload_lora_adapter", {"lora_name": "fresh"})
    assert gone.text == "Success: LoRA adapter 'fresh' removed successfully."
    assert "fresh" not in {m.id for m in (await client.models.list()).data}
    missing = _admin(lora_stack, "/v1/unload_lora_adapter", {"lora_name": "fresh"})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "The lora adapter 'fresh' cannot be found."
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(
            model="fresh", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )


def test_a_load_without_a_path_is_a_400(lora_stack: Stack) -> None:
    response = _admin(lora_stack, "/v1/load_lora_adapter", {"lora_name": "x"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "Both 'lora_name' and 'lora_path' must be provided."
    )


def test_placement_loads_a_hot_adapter_on_a_second_worker(tmp_path: Path, model_dir: Path) -> None:
    """One worker holds ``hot``; a steady crowd of its requests makes the placer load it on the
    other worker (asserted by the outcome: a second card lists it)."""
    stack = start_stack(
        tmp_path,
        model_dir,
        router_mode="kv",
        lora_modules="hot=/adapters/hot",
        mocker_args="--speedup-ratio 1 --seed 1 --max-loras 2",
        service_args={
            "router": [
                "--lora-min-inflight",
                "2",
                "--lora-placement-interval-s",
                "0.2",
            ]
        },
    )
    try:
        asyncio.run(_placement(stack))
    finally:
        stack.stop()


async def _placement(stack: Stack) -> None:
    cards = await _cards(stack)
    ids = sorted(c.worker_id for c in cards)
    keep, drop = ids[0], ids[1]
    response = _admin(stack, "/v1/unload_lora_adapter", {"lora_name": "hot", "worker_ids": [drop]})
    assert response.status_code == 200, response.text
    holders = {c.worker_id for c in await _cards(stack) if any(a.name == "hot" for a in c.loras)}
    assert holders == {keep}
    async with openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0
    ) as client:

        async def one(i: int) -> None:
            await client.chat.completions.create(
                model="hot",
                messages=[{"role": "user", "content": f"busy {i}"}],
                max_tokens=64,
            )

        async def second_holder() -> bool:
            cards = await _cards(stack)
            return sum(1 for c in cards if any(a.name == "hot" for a in c.loras)) == 2

        for round_ in range(20):  # bounded: each round is 16 concurrent requests
            await asyncio.gather(*(one(round_ * 16 + i) for i in range(16)))
            if await second_holder():
                break
        await eventually_awaited(
            second_holder, timeout_s=10, message="no second worker loaded the hot adapter"
        )
    holders = {c.worker_id for c in await _cards(stack) if any(a.name == "hot" for a in c.loras)}
    assert holders == {keep, drop}


def test_up_lora_modules_reach_every_worker(tmp_path: Path, model_dir: Path) -> None:
    env = {"JETSERVE_NAMESPACE": "loraup"}
    proc = _start_up(
        env,
        "--workers",
        "2",
        "--model-path",
        str(model_dir),
        "--run-dir",
        str(tmp_path),
        "--lora-modules",
        "sql=/adapters/sql",
        '{"name": "chat", "path": "/adapters/chat", "base_model_name": "' + MODEL + '"}',
        "--mocker-max-loras",
        "2",
    )
    try:
        base = _up_line(proc).split()[3]

        def listed() -> dict[str, Any]:
            models = httpx.get(f"{base}/models", timeout=10).json()["data"]
            return {m["id"]: m for m in models}

        found: dict[str, Any] = {}
        for _ in range(100):
            found = listed()
            if "chat" in found and found["chat"]["jetserve"]["workers"]["both"] == 2:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert found["sql"]["parent"] == MODEL
        assert found["chat"]["parent"] == MODEL
        assert found["chat"]["jetserve"]["workers"]["both"] == 2
        answer = httpx.post(
            f"{base}/chat/completions",
            json={"model": "sql", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "sql"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_up_refuses_a_bad_lora_module_naming_it() -> None:
    from tests.e2e.test_launcher import _up

    result = subprocess.run(
        _up("--lora-modules", "no-path"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "'no-path' is not name=path" in result.stderr
