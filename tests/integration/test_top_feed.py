"""``jetserve top``'s feed on a real server: encoded routing decisions and lifecycle phases, as
routers and workers publish them, become the frame's admission figures (issue 26)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client

from services.cli.top.feed import Feed
from shared import codec
from shared.messages import RequestPhase, RouteDecision
from shared.subjects import Subjects
from tests.support import eventually_async


@pytest.fixture
async def feed(nc: Client, subjects: Subjects) -> AsyncIterator[Feed]:
    feed = Feed(nc, subjects, ())
    await feed.start()
    try:
        yield feed
    finally:
        await feed.stop()


def _decision(request_id: str, policy_class: str, tenant: str, prefill: int) -> RouteDecision:
    return RouteDecision(
        request_id=request_id,
        router_id="r1",
        worker_id="w1",
        model="m",
        mode="kv",
        prefill_tokens=prefill,
        prompt_tokens=prefill + 20,
        policy_class=policy_class,
        tenant=tenant,
        queued_ms=40.0 if policy_class == "batch" else 0.0,
    )


async def test_decisions_and_finished_phases_make_classes_and_tenants(
    feed: Feed, nc: Client, subjects: Subjects
) -> None:
    for decision in (
        _decision("a", "premium", "acme", prefill=300),
        _decision("b", "batch", "acme", prefill=100),
        _decision("c", "batch", "", prefill=0),
    ):
        await nc.publish(subjects.decisions, codec.encode(decision))

    def acme_tokens() -> float:
        seen = feed.events.tenants.get("acme")
        return seen.tokens.since(0.0)[0] if seen else 0.0

    def decisions() -> int:
        return sum(c.decisions.since(0.0)[1] for c in feed.events.classes.values())

    # Each subscription has its own callback task: the phase goes out once the decisions are in.
    await eventually_async(lambda: decisions() == 3, message="three decisions on the bus")
    assert acme_tokens() == 440
    phase = RequestPhase(request_id="a", worker_id="w1", phase="finished", output_tokens=9)
    await nc.publish(subjects.lifecycle("w1"), codec.encode(phase))
    await eventually_async(lambda: acme_tokens() == 449, message="acme's output tokens")
    admission = feed.frame(60.0).admission
    assert [(c.policy_class, c.share, c.queued) for c in admission.classes] == [
        ("batch", 0.25, 2),
        ("premium", 0.75, 0),
    ]
    assert [(t.tenant, t.tokens, t.budget) for t in admission.tenants] == [("acme", 449, None)]
