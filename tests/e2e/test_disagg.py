"""Disaggregated serving end to end (issue 24): 2 prefill + 2 decode mockers behind one router.

Driven by the openai client against ``services.cli.stack`` processes on a real nats-server:
both phases run on workers of the right roles (``nvext.extra_fields: ["worker_id"]``), pins are
honoured and bad pins get their statuses, conditional disaggregation keeps a short prompt local,
query-only mode answers without a ``Generate`` reaching any worker, and ``--enforce-disagg``
without a live prefill worker is a 503. (Workers killed under load: ``tests/chaos``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.js.errors
import openai
import pytest

from services.cli.stack import Stack
from shared import codec
from shared.messages import Generate, RouteDecision, WorkerCard
from shared.subjects import Subjects
from tests.e2e.conftest import MODEL, _wait_for_workers, start_stack
from tests.support import eventually_async, eventually_awaited, registered_cards

pytestmark = pytest.mark.e2e

MIN_REMOTE_TOKENS = 200
"""``--disagg-min-prefill-tokens``: shorter uncached prompts stay on the decode worker."""
SHORT = [{"role": "user", "content": "Hi there."}]
_COUNTER = iter(range(1_000_000))


def _long_text() -> str:
    """A prompt well over ``MIN_REMOTE_TOKENS``, new each time: a prompt a decode worker already
    holds (pulled for an earlier request) would rightly stay local."""
    tag = next(_COUNTER)
    return " ".join(f"harbor{tag}x{i} lantern" for i in range(200))


def _long() -> list[dict[str, str]]:
    return [{"role": "user", "content": _long_text()}]


WORKER_ID = {"nvext": {"extra_fields": ["worker_id"]}}


def _p_d_stack(run_dir: Path, model_dir: Path, **overrides: Any) -> Stack:
    count = overrides.get("prefill_workers", 0) + overrides.get("decode_workers", 0)
    stack = start_stack(run_dir, model_dir, workers=0, router_mode="kv", **overrides)
    try:
        asyncio.run(_wait_for_workers(stack, count, timeout_s=30))
    except (TimeoutError, AssertionError):
        stack.stop()
        raise
    return stack


@pytest.fixture(scope="module")
def pd_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    router = ["--router-conditional-disagg", "--disagg-min-prefill-tokens", str(MIN_REMOTE_TOKENS)]
    s = _p_d_stack(
        tmp_path_factory.mktemp("pd"),
        model_dir,
        prefill_workers=2,
        decode_workers=2,
        service_args={"router": router},
    )
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
async def client(pd_stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{pd_stack.base_url}/v1", api_key="x", max_retries=0
    ) as c:
        yield c


async def _cards(stack: Stack) -> dict[str, WorkerCard]:
    """The registry's worker cards (read again for a while until there is one)."""
    nc = await nats.connect(stack.nats_url)
    try:

        async def listed() -> dict[str, WorkerCard]:
            cards = await registered_cards(nc.jetstream(), stack.config.namespace)
            return {card.worker_id: card for card in cards}

        return await eventually_awaited(
            listed, timeout_s=5, interval_s=0.1, message="no worker card in the registry"
        )
    finally:
        await nc.close()


async def _roles(stack: Stack) -> dict[str, list[str]]:
    roles: dict[str, list[str]] = {"prefill": [], "decode": [], "both": []}
    for card in (await _cards(stack)).values():
        roles[card.role].append(card.worker_id)
    return {role: sorted(ids) for role, ids in roles.items()}


def _nvext(response: Any) -> dict[str, Any]:
    return (response.model_extra or {}).get("nvext") or {}


class TestBothPhases:
    @pytest.mark.parametrize("stream", [False, True])
    async def test_chat_runs_its_phases_on_workers_of_the_right_roles(
        self, client: openai.AsyncOpenAI, pd_stack: Stack, stream: bool
    ) -> None:
        roles = await _roles(pd_stack)
        assert (len(roles["prefill"]), len(roles["decode"])) == (2, 2)
        kwargs: dict[str, Any] = {"model": MODEL, "messages": _long(), "max_tokens": 12}
        if not stream:
            response = await client.chat.completions.create(**kwargs, extra_body=WORKER_ID)
            text, worker = response.choices[0].message.content, _nvext(response)["worker_id"]
        else:
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    **kwargs, stream=True, extra_body=WORKER_ID
                )
            ]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            worker = next(_nvext(c)["worker_id"] for c in chunks if _nvext(c))
        assert text
        assert worker["prefill_worker_id"] in roles["prefill"]
        assert worker["decode_worker_id"] in roles["decode"]

    @pytest.mark.parametrize("stream", [False, True])
    async def test_completions_run_both_phases(
        self, client: openai.AsyncOpenAI, pd_stack: Stack, stream: bool
    ) -> None:
        roles = await _roles(pd_stack)
        kwargs: dict[str, Any] = {"model": MODEL, "prompt": _long_text(), "max_tokens": 8}
        if not stream:
            response = await client.completions.create(**kwargs, extra_body=WORKER_ID)
            assert response.choices[0].text
            worker = _nvext(response)["worker_id"]
            assert response.usage is not None
            assert response.usage.prompt_tokens > MIN_REMOTE_TOKENS
        else:
            chunks = [
                c
                async for c in await client.completions.create(
                    **kwargs, stream=True, extra_body=WORKER_ID
                )
            ]
            assert "".join(c.choices[0].text for c in chunks if c.choices)
            worker = next(_nvext(c)["worker_id"] for c in chunks if _nvext(c))
        assert worker["prefill_worker_id"] in roles["prefill"]
        assert worker["decode_worker_id"] in roles["decode"]

    async def test_a_short_prompt_stays_on_the_decode_worker(
        self, client: openai.AsyncOpenAI, pd_stack: Stack
    ) -> None:
        roles = await _roles(pd_stack)
        response = await client.chat.completions.create(
            model=MODEL,
            messages=SHORT,
            max_tokens=4,
            extra_body=WORKER_ID,  # type: ignore[arg-type]
        )
        assert _nvext(response)["worker_id"] in roles["decode"]  # aggregated: a plain id

    async def test_the_decision_on_the_bus_names_both_phases(
        self, client: openai.AsyncOpenAI, pd_stack: Stack
    ) -> None:
        nc = await nats.connect(pd_stack.nats_url)
        decisions: list[RouteDecision] = []

        async def on_decision(msg: Any) -> None:
            decisions.append(codec.decode(msg.data, RouteDecision))

        await nc.subscribe(Subjects(pd_stack.config.namespace).decisions, cb=on_decision)
        await nc.flush()
        try:
            for messages in (_long(), SHORT):
                await client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=2,  # type: ignore[arg-type]
                )
            await nc.flush()
            await eventually_async(
                lambda: len(decisions) >= 2,
                timeout_s=5,
                interval_s=0.1,
                message="fewer than two routing decisions",
            )
        finally:
            await nc.close()
        long, short = decisions[:2]
        assert (long.disagg, short.disagg) == ("remote", "local")
        assert long.prefill_worker_id
        assert long.prefill_candidates
        assert short.prefill_worker_id == ""


class TestPins:
    async def test_pins_of_both_phases_are_honoured(
        self, client: openai.AsyncOpenAI, pd_stack: Stack
    ) -> None:
        roles = await _roles(pd_stack)
        for prefill in roles["prefill"]:
            for decode in roles["decode"]:
                response = await client.chat.completions.create(
                    model=MODEL,
                    messages=SHORT,  # short: the prefill pin still sends it to the prefill worker
                    max_tokens=2,
                    extra_body={
                        "nvext": {
                            "prefill_worker_id": prefill,
                            "decode_worker_id": decode,
                            "extra_fields": ["worker_id"],
                        }
                    },
                )
                worker = _nvext(response)["worker_id"]
                assert (worker["prefill_worker_id"], worker["decode_worker_id"]) == (
                    prefill,
                    decode,
                )

    async def test_header_pins_are_honoured(self, pd_stack: Stack) -> None:
        roles = await _roles(pd_stack)
        prefill, decode = roles["prefill"][1], roles["decode"][0]
        async with httpx.AsyncClient(base_url=pd_stack.base_url, timeout=30) as http:
            response = await http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": _long(), "max_tokens": 2, **WORKER_ID},
                headers={
                    "x-dynamo-prefill-instance-id": prefill,
                    "x-dynamo-worker-instance-id": decode,
                    "x-dynamo-dp-rank": "0",
                },
            )
        assert response.status_code == 200, response.text
        worker = response.json()["nvext"]["worker_id"]
        assert (worker["prefill_worker_id"], worker["decode_worker_id"]) == (prefill, decode)

    @pytest.mark.parametrize(
        ("nvext", "param"),
        [
            ({"prefill_worker_id": "no-such-worker"}, "nvext.prefill_worker_id"),
            ({"decode_worker_id": "PREFILL"}, "nvext.decode_worker_id"),
            ({"prefill_worker_id": "DECODE"}, "nvext.prefill_worker_id"),
            ({"decode_worker_id": "DECODE", "dp_rank": 3}, "nvext.dp_rank"),
        ],
    )
    async def test_bad_pins_are_400_naming_the_field(
        self, pd_stack: Stack, nvext: dict[str, Any], param: str
    ) -> None:
        roles = await _roles(pd_stack)
        named = {"PREFILL": roles["prefill"][0], "DECODE": roles["decode"][0]}
        body = {k: named.get(v, v) if isinstance(v, str) else v for k, v in nvext.items()}
        async with httpx.AsyncClient(base_url=pd_stack.base_url, timeout=30) as http:
            response = await http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": SHORT, "max_tokens": 2, "nvext": body},
            )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


class TestQueryOnly:
    async def test_query_only_answers_without_generating(
        self, client: openai.AsyncOpenAI, pd_stack: Stack
    ) -> None:
        roles = await _roles(pd_stack)
        nc = await nats.connect(pd_stack.nats_url)
        reached: list[str] = []

        async def on_generate(msg: Any) -> None:
            reached.append(codec.decode(msg.data, Generate).request_id)

        subjects = Subjects(pd_stack.config.namespace)
        await nc.subscribe(subjects.generate("*"), cb=on_generate)
        await nc.flush()
        try:
            query = {"nvext": {"annotations": ["query_instance_id"]}}
            for stream in (False, True):
                request_id = f"query-{stream}"
                kwargs: dict[str, Any] = {
                    "model": MODEL,
                    "messages": _long(),
                    "max_tokens": 8,
                    "extra_body": query,
                    "extra_headers": {"X-Request-Id": request_id},
                }
                if stream:
                    chunks = [
                        c async for c in await client.chat.completions.create(**kwargs, stream=True)
                    ]
                    answer = next(_nvext(c) for c in chunks if _nvext(c))
                else:
                    answer = _nvext(await client.chat.completions.create(**kwargs))
                worker = answer["worker_id"]
                assert worker["prefill_worker_id"] in roles["prefill"]
                assert worker["decode_worker_id"] in roles["decode"]
                assert len(answer["token_ids"]) > MIN_REMOTE_TOKENS
                # A real request goes through the same path, so a Generate would have arrived.
                await client.chat.completions.create(
                    model=MODEL,
                    messages=SHORT,
                    max_tokens=1,  # type: ignore[arg-type]
                )
                await nc.flush()
                assert request_id not in reached
            assert reached  # the probe requests did reach workers
        finally:
            await nc.close()


# --- stacks of their own: a dead prefill worker, no prefill worker ------------------------------


def _worker_pids(stack: Stack) -> dict[str, int]:
    """Worker id -> pid of the process hosting it (from its ``worker_started`` line)."""
    found: dict[str, int] = {}
    for child in stack.children:
        if child.log_path is None:
            continue
        for line in child.log_path.read_text().splitlines():
            if '"worker_started"' in line:
                found[json.loads(line)["worker_id"]] = child.proc.pid
    return found


@contextlib.contextmanager
def _small_stack(run_dir: Path, model_dir: Path, prefill: int, decode: int) -> Iterator[Stack]:
    s = _p_d_stack(
        run_dir,
        model_dir,
        prefill_workers=prefill,
        decode_workers=decode,
        service_args={"router": ["--enforce-disagg"]},
    )
    try:
        yield s
    finally:
        s.stop()


async def _chat(stack: Stack, nvext: dict[str, Any] | None = None) -> httpx.Response:
    body: dict[str, Any] = {"model": MODEL, "messages": _long(), "max_tokens": 2}
    if nvext is not None:
        body["nvext"] = nvext
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as http:
        return await http.post("/v1/chat/completions", json=body)


def test_enforced_disaggregation_without_prefill_worker_is_503(
    tmp_path: Path, model_dir: Path
) -> None:
    with _small_stack(tmp_path, model_dir, prefill=0, decode=1) as stack:
        response = asyncio.run(_chat(stack))
    assert response.status_code == 503, response.text
    assert response.headers.get("retry-after")
    assert response.json()["error"]["code"] == "no_worker_available"


def test_a_dead_pinned_prefill_worker_is_503_then_enforced_503(
    tmp_path: Path, model_dir: Path
) -> None:
    with _small_stack(tmp_path, model_dir, prefill=1, decode=1) as stack:
        prefill = asyncio.run(_roles(stack))["prefill"][0]
        assert asyncio.run(_chat(stack, {"prefill_worker_id": prefill})).status_code == 200
        os.kill(_worker_pids(stack)[prefill], signal.SIGKILL)
        pinned = asyncio.run(_chat(stack, {"prefill_worker_id": prefill}))
        unpinned = asyncio.run(_chat(stack))
    assert pinned.status_code == 503, pinned.text
    assert pinned.headers.get("retry-after")
    assert prefill in pinned.json()["error"]["message"]
    assert unpinned.status_code == 503, unpinned.text
