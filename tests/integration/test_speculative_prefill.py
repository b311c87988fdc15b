"""Speculative prefill (``RoutingHints.speculative_prefill``) through a real router and mocker:
a finished turn warms prompt + answer on its worker; a cancelled warm-up frees its slot; a
session that moves cancels the warm-up on its old worker."""

from __future__ import annotations

import asyncio
import uuid

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.mocker.service import ModelInfo
from services.router.service import Router
from shared import codec
from shared.hashing import prefix_hashes
from shared.messages import (
    Cancel,
    Generate,
    RouteDecision,
    RoutingHints,
    SamplingParams,
    TokenBatch,
)
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.sessions import session_key, speculative_request_id
from shared.subjects import Subjects
from shared.worker.runtime import WorkerRuntime
from tests.integration.router_kv_support import until
from tests.integration.test_router_mocker import Stream, running_mocker, running_router

MODEL = DEFAULT_MODEL_NAME
PROMPT = tuple(range(200, 250))  # 50 tokens: 3 full blocks of 16 and a partial one


def _turn(
    stream: Stream, prompt: tuple[int, ...], session: str, *, warm: bool = True, **sampling: int
) -> Generate:
    return Generate(
        request_id=stream.request_id,
        model=MODEL,
        token_ids=prompt,
        sampling=SamplingParams(ignore_eos=True, **sampling),
        stream_to=stream.subject,
        routing=RoutingHints(session_id=session, speculative_prefill=warm),
    )


async def _run(nc: Client, subjects: Subjects, gen: Generate, stream: Stream) -> list[int]:
    await nc.publish(subjects.route, codec.encode(gen), reply=stream.subject)
    batches = await stream.until_finished()
    return [t for b in batches for t in b.token_ids]


async def test_the_next_turn_finds_prompt_and_answer_cached(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", num_workers=2) as mocker,
        running_router(nats_url, subjects, router_mode="kv", session_affinity_ttl_s=60.0) as router,
    ):
        decisions = await nc.subscribe(subjects.decisions)
        async with Stream(nc, subjects) as stream:
            first = _turn(stream, PROMPT, session, max_tokens=14)  # 64 tokens in all: 4 blocks
            answer = await _run(nc, subjects, first, stream)
        warmed = (*PROMPT, *answer)
        worker = _worker(
            mocker.workers, codec.decode((await decisions.next_msg(5)).data, RouteDecision)
        )
        hashes = prefix_hashes(warmed, worker.block_size)
        index = router.core.sync.index
        spec_id = speculative_request_id(first.request_id, MODEL, session)

        def cached() -> bool:
            return index.find_matches(hashes).get(worker.worker_id, 0) == len(hashes)

        await until(cached, what="the warmed prefix in the router's index")
        await until(lambda: spec_id not in worker.engine, what="the warm-up to end")
        async with Stream(nc, subjects) as stream:
            second = _turn(stream, (*warmed, *range(900, 920)), session, warm=False, max_tokens=2)
            await _run(nc, subjects, second, stream)
        decision = codec.decode((await decisions.next_msg(5)).data, RouteDecision)
        await decisions.unsubscribe()
    assert decision.worker_id == worker.worker_id
    # without the warm-up 3: the block the answer's last token completes was never computed
    assert decision.overlap_blocks == len(warmed) // worker.block_size == 4
    # the warm-up ran as a request of its own: the prompt + answer were prefilled again
    assert worker.engine.stats.prompt_tokens == len(PROMPT) + len(warmed) + len(second.token_ids)


async def test_a_cancelled_warm_up_frees_its_slot(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    async with (
        running_mocker(
            nats_url, subjects, model_info, worker_id="w", max_num_seqs=1, speedup_ratio=1.0
        ) as mocker,
        running_router(nats_url, subjects, session_affinity_ttl_s=60.0),
    ):
        worker = mocker.workers[0]
        async with Stream(nc, subjects) as stream, Stream(nc, subjects) as blocker:
            turn = _turn(stream, PROMPT, session, max_tokens=4)
            await nc.publish(subjects.route, codec.encode(turn), reply=stream.subject)
            assert isinstance(await stream.next(), TokenBatch)
            # one running request at a time: the warm-up will wait behind this one
            hog = Generate(
                request_id=blocker.request_id,
                model=MODEL,
                token_ids=(1, 2, 3),
                sampling=SamplingParams(max_tokens=5000, ignore_eos=True),
                stream_to=blocker.subject,
            )
            await nc.publish(subjects.route, codec.encode(hog), reply=blocker.subject)
            await stream.until_finished()
            spec_id = speculative_request_id(turn.request_id, MODEL, session)
            await until(lambda: spec_id in worker.engine, what="the warm-up to queue")
            assert worker.engine.num_waiting == 1
            cancel = Cancel(request_id=spec_id, reason="session_moved", worker_id=worker.worker_id)
            await nc.publish(subjects.cancel, codec.encode(cancel))
            await until(lambda: spec_id not in worker.engine, what="the warm-up cancelled")
            assert worker.engine.num_waiting == 0
            await nc.publish(subjects.cancel, codec.encode(Cancel(request_id=hog.request_id)))
            await until(lambda: not worker.engine.has_work, what="the worker idle")


async def test_a_session_that_moves_cancels_the_warm_up_on_its_old_worker(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    cancels: asyncio.Queue[Cancel] = asyncio.Queue()

    async def on_cancel(msg: Msg) -> None:
        await cancels.put(codec.decode(msg.data, Cancel))

    async with (
        running_mocker(nats_url, subjects, model_info, worker_id="w", num_workers=2) as mocker,
        running_router(
            nats_url,
            subjects,
            router_mode="round-robin",
            session_affinity_ttl_s=60.0,
            session_affinity_mode="hard",
        ) as router,
    ):
        sub = await nc.subscribe(subjects.cancel, cb=on_cancel)
        async with Stream(nc, subjects) as stream:
            turn = _turn(stream, PROMPT, session, max_tokens=2)
            answer = await _run(nc, subjects, turn, stream)
        bound = await _bound_to(router, session)
        first = next(w for w in mocker.workers if w.worker_id == bound)
        await first.stop(1.0)  # the bound worker leaves: the next turn must go elsewhere
        await until(lambda: len(router.live(MODEL)) == 1, what="the worker gone")
        async with Stream(nc, subjects) as stream:
            await _run(
                nc, subjects, _turn(stream, (*PROMPT, *answer), session, max_tokens=2), stream
            )
        cancel = await asyncio.wait_for(cancels.get(), 5)
        await sub.unsubscribe()
    assert cancel.request_id == speculative_request_id(turn.request_id, MODEL, session)
    assert cancel.worker_id == first.worker_id


def _worker(workers: list[WorkerRuntime], decision: RouteDecision) -> WorkerRuntime:
    return next(w for w in workers if w.worker_id == decision.worker_id)


async def _bound_to(router: Router, session: str) -> str:
    assert router.sessions is not None
    store, key = router.sessions.store, session_key(MODEL, session)
    await until(lambda: store.binding(key) is not None, what="the session bound")
    binding = store.binding(key)
    assert binding is not None
    return binding.worker_id
