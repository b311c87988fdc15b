"""Session affinity through the whole stack (issue 26): ``X-Dynamo-Session-ID`` keeps a
conversation's turns on one worker across two router replicas; other requests still spread."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from services.cli.stack import Stack
from tests.e2e.conftest import MODEL, route_decisions, running_stack

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def session_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """Two routers taking turns (round-robin: without affinity, turns alternate workers)."""
    with running_stack(
        tmp_path_factory.mktemp("sessions"),
        model_dir,
        routers=2,
        router_mode="round-robin",
        extra_env={"JETSERVE_ROUTER_SESSION_AFFINITY_TTL_S": "60"},
    ) as stack:
        yield stack


async def _chat(
    client: openai.AsyncOpenAI,
    messages: list[dict[str, str]],
    headers: dict[str, str],
    **kw: object,
) -> tuple[str, str]:
    """One turn: (the request id the gateway answered with, the answer)."""
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        extra_headers=headers,
        **kw,  # type: ignore[arg-type]
    )
    completion = raw.parse()
    request_id = raw.headers.get("x-request-id") or completion.id
    return request_id, completion.choices[0].message.content or ""


def _restart_a_router(stack: Stack) -> None:
    """Stop one router replica (SIGTERM) and start it again: a new process, a new router id."""
    router = next(c for c in stack.children if c.name.startswith("router"))
    router.proc.send_signal(signal.SIGTERM)
    router.proc.wait(timeout=30)
    stack.restart(router)


async def test_a_conversation_stays_on_one_worker_across_a_router_restart(
    session_stack: Stack,
) -> None:
    session = f"conv-{uuid.uuid4().hex[:8]}"
    client = openai.AsyncOpenAI(base_url=f"{session_stack.base_url}/v1", api_key="x", max_retries=0)
    messages: list[dict[str, str]] = []
    async with route_decisions(session_stack) as decisions:
        ids = []
        for turn in range(20):
            if turn == 10:  # the binding is in the KV bucket, not in the router that made it
                await asyncio.to_thread(_restart_a_router, session_stack)
            messages.append({"role": "user", "content": f"turn {turn}: tell me more"})
            request_id, answer = await _chat(
                client,
                messages,
                {"X-Dynamo-Session-ID": session},
                extra_body={"nvext": {"agent_hints": {"speculative_prefill": True}}},
            )
            messages.append({"role": "assistant", "content": answer})
            ids.append(request_id)
        plain = [
            (await _chat(client, [{"role": "user", "content": "hi"}], {}))[0] for _ in range(4)
        ]
        await asyncio.sleep(0.2)  # the last decisions' messages
    await client.close()
    routed = [decisions[_bare(i)] for i in ids if _bare(i) in decisions]
    assert len(routed) == len(ids), (ids, list(decisions))
    assert len({d.worker_id for d in routed}) == 1, [d.worker_id for d in routed]
    assert len({d.router_id for d in routed}) >= 2  # both replicas routed some turns
    spread = {decisions[_bare(i)].worker_id for i in plain if _bare(i) in decisions}
    assert len(spread) == 2  # requests without a session are still spread


def _bare(request_id: str) -> str:
    """The bus request id of a response id (``chatcmpl-<id>``)."""
    return request_id.removeprefix("chatcmpl-")
