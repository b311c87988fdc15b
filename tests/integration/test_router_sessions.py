"""Session affinity through real routers and the session bucket: replicas, restarts, hard/soft."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from nats.aio.client import Client
from nats.aio.subscription import Subscription

from services.router.service import Router
from shared import codec
from shared.messages import Generate, RouteDecision, RoutingHints, WorkerLoad
from shared.sessions import session_key
from shared.subjects import Subjects
from tests.integration.router_kv_support import (
    MODEL,
    fake_workers,
    generate,
    running_router,
    until,
)

WORKERS = ("w1", "w2", "w3", "w4")
TTL_S = 60.0


def _router(nats_url: str, subjects: Subjects, mode: str = "soft", **overrides: Any) -> Any:
    settings: dict[str, Any] = {
        "router_mode": "round-robin",  # without affinity, turns would spread over every worker
        "session_affinity_ttl_s": TTL_S,
        "session_affinity_mode": mode,
        "active_decode_blocks_threshold": 0.9,
        **overrides,
    }
    return running_router(nats_url, subjects, **settings)


def _turn(session_id: str, number: int) -> Generate:
    prompt = tuple(range(1000, 1000 + 16 * (number + 1)))
    hints = RoutingHints(session_id=session_id)
    return generate(prompt, request_id=f"{session_id}-turn-{number}", routing=hints)


@asynccontextmanager
async def _decisions(nc: Client, subjects: Subjects) -> AsyncIterator[asyncio.Queue[RouteDecision]]:
    queue: asyncio.Queue[RouteDecision] = asyncio.Queue()

    async def on(msg: Any) -> None:
        await queue.put(codec.decode(msg.data, RouteDecision))

    sub: Subscription = await nc.subscribe(subjects.decisions, cb=on)
    try:
        yield queue
    finally:
        await sub.unsubscribe()


async def _send(
    nc: Client, subjects: Subjects, decisions: asyncio.Queue[RouteDecision], gen: Generate
) -> RouteDecision:
    await nc.publish(subjects.route, codec.encode(gen))
    while True:
        decision = await asyncio.wait_for(decisions.get(), 5.0)
        if decision.request_id == gen.request_id:
            return decision


async def _bound(router: Router, session_id: str, worker_id: str) -> None:
    assert router.sessions is not None
    key = session_key(MODEL, session_id)
    store = router.sessions.store

    def holds() -> bool:
        binding = store.binding(key)
        return binding is not None and binding.worker_id == worker_id

    await until(holds, what=f"{router.router_id} to bind {session_id} to {worker_id}")


async def _busy(nc: Client, subjects: Subjects, worker_id: str, *, used: int) -> None:
    report = WorkerLoad(worker_id=worker_id, kv_used_blocks=used, kv_total_blocks=1024)
    await nc.publish(subjects.load(worker_id), codec.encode(report))


async def test_a_sessions_turns_stay_on_one_worker_through_two_replicas(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    async with (
        fake_workers(nc, subjects, *WORKERS),
        _router(nats_url, subjects) as a,
        _router(nats_url, subjects) as b,
        _decisions(nc, subjects) as decisions,
    ):
        await until(lambda: len(a.live(MODEL)) == len(b.live(MODEL)) == 4, what="workers")
        first = await _send(nc, subjects, decisions, _turn(session, 0))
        await _bound(a, session, first.worker_id)
        await _bound(b, session, first.worker_id)
        seen = [first] + [
            await _send(nc, subjects, decisions, _turn(session, number)) for number in range(1, 20)
        ]
        others = [
            await _send(nc, subjects, decisions, _turn(f"{session}-other{i}", 0)) for i in range(4)
        ]
    assert {d.worker_id for d in seen} == {first.worker_id}
    assert {d.router_id for d in seen} == {a.router_id, b.router_id}
    # Round-robin goes on for other sessions: one replica took at least two of the four, and its
    # cursor gave them two workers (each replica has its own cursor, so one may be on w1 again).
    assert len({d.worker_id for d in others}) >= 2, [d.worker_id for d in others]
    hits = sum(r.metrics.session_bindings.labels("hit")._value.get() for r in (a, b))
    assert hits == 19


async def test_a_binding_outlives_the_router_that_made_it(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    async with fake_workers(nc, subjects, *WORKERS), _decisions(nc, subjects) as decisions:
        async with _router(nats_url, subjects, mode="hard") as a:
            await until(lambda: len(a.live(MODEL)) == 4, what="workers")
            first = await _send(nc, subjects, decisions, _turn(session, 0))
            await _bound(a, session, first.worker_id)
        async with _router(nats_url, subjects, mode="hard") as b:
            await until(lambda: len(b.live(MODEL)) == 4, what="workers")
            later = [await _send(nc, subjects, decisions, _turn(session, n)) for n in range(1, 6)]
    assert {d.worker_id for d in later} == {first.worker_id}
    assert {d.router_id for d in later} == {b.router_id}


async def _bind_then_make_busy(
    a: Router, nc: Client, subjects: Subjects, decisions: asyncio.Queue[RouteDecision], session: str
) -> RouteDecision:
    """The session's first turn (bound where it went), then that worker reports itself busy."""
    await until(lambda: len(a.live(MODEL)) == 4, what="workers")
    first = await _send(nc, subjects, decisions, _turn(session, 0))
    await _bound(a, session, first.worker_id)
    await _busy(nc, subjects, first.worker_id, used=1000)
    await until(
        lambda: a.core.reports.fresh(first.worker_id, a._clock()) is not None, what="report"
    )
    return first


async def test_soft_affinity_moves_off_a_busy_worker(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    async with (
        fake_workers(nc, subjects, *WORKERS),
        _router(nats_url, subjects, mode="soft") as a,
        _decisions(nc, subjects) as decisions,
    ):
        first = await _bind_then_make_busy(a, nc, subjects, decisions, session)
        moved = await _send(nc, subjects, decisions, _turn(session, 1))
        assert moved.worker_id != first.worker_id
        await _bound(a, session, moved.worker_id)
        after = await _send(nc, subjects, decisions, _turn(session, 2))
    assert after.worker_id == moved.worker_id  # the binding moved once, and holds
    assert a.metrics.session_bindings.labels("moved")._value.get() == 1


async def test_hard_affinity_waits_for_a_busy_worker(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    async with (
        fake_workers(nc, subjects, *WORKERS),
        _router(nats_url, subjects, mode="hard") as a,
        _decisions(nc, subjects) as decisions,
    ):
        first = await _bind_then_make_busy(a, nc, subjects, decisions, session)
        busy_turn = _turn(session, 1)
        stream = await nc.subscribe(busy_turn.stream_to)
        await nc.publish(subjects.route, codec.encode(busy_turn))
        # Never elsewhere: it waits for its worker.
        routed = [d for d in await _drain(decisions, 1.0) if d.request_id == busy_turn.request_id]
        assert routed == []  # it waits in the router queue
        await _busy(nc, subjects, first.worker_id, used=0)
        while (decision := await asyncio.wait_for(decisions.get(), 5.0)).request_id != (
            busy_turn.request_id
        ):
            pass
        assert decision.worker_id == first.worker_id
        await stream.unsubscribe()
        await _bound(a, session, first.worker_id)
    assert a.metrics.session_bindings.labels("moved")._value.get() == 0


async def test_a_dead_bound_worker_moves_the_binding_in_hard_mode(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    async with (
        fake_workers(nc, subjects, *WORKERS) as workers,
        _router(nats_url, subjects, mode="hard") as a,
        _router(nats_url, subjects, mode="hard") as b,
        _decisions(nc, subjects) as decisions,
    ):
        await until(lambda: len(a.live(MODEL)) == len(b.live(MODEL)) == 4, what="workers")
        first = await _send(nc, subjects, decisions, _turn(session, 0))
        await _bound(b, session, first.worker_id)
        dead = next(w for w in workers if w.worker_id == first.worker_id)
        await dead.leave()
        await until(lambda: len(a.live(MODEL)) == len(b.live(MODEL)) == 3, what="a worker gone")
        moved = await _send(nc, subjects, decisions, _turn(session, 1))
        assert moved.worker_id != first.worker_id
        await _bound(a, session, moved.worker_id)
        await _bound(b, session, moved.worker_id)
        later = [await _send(nc, subjects, decisions, _turn(session, n)) for n in range(2, 8)]
    assert {d.worker_id for d in later} == {moved.worker_id}


async def test_racing_first_turns_agree_on_one_binding(
    nats_url: str, subjects: Subjects, nc: Client
) -> None:
    """Two replicas route a session's first turns at once: the bucket's create picks one."""
    session = f"s-{uuid.uuid4().hex[:8]}"
    async with (
        fake_workers(nc, subjects, *WORKERS),
        _router(nats_url, subjects, seed=1) as a,
        _router(nats_url, subjects, seed=2) as b,
    ):
        await until(lambda: len(a.live(MODEL)) == len(b.live(MODEL)) == 4, what="workers")
        await asyncio.gather(a.on_route(_turn(session, 0)), b.on_route(_turn(session, 1)))
        key = session_key(MODEL, session)
        assert a.sessions is not None
        assert b.sessions is not None
        store_a, store_b = a.sessions.store, b.sessions.store

        def agree() -> bool:
            one, two = store_a.binding(key), store_b.binding(key)
            return one is not None and two is not None and one.worker_id == two.worker_id

        await until(agree, what="both replicas to hold one binding")


async def _drain(queue: asyncio.Queue[RouteDecision], seconds: float) -> list[RouteDecision]:
    """Every decision that comes within ``seconds``."""
    got: list[RouteDecision] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        try:
            got.append(await asyncio.wait_for(queue.get(), left))
        except TimeoutError:
            break
    return got
