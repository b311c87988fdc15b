"""Disaggregated and data-parallel vLLM engines against fakes that follow vLLM's interfaces
(``tests/fakes/vllm_fakes.py``: ``FakeNixl`` after ``NixlConnector``, ``FakeDpAsyncLLM`` after
``AsyncLLM`` with ``data_parallel_size`` > 1), in-process and over HTTP, KV events over real ZMQ.

A prefill then a decode pass ``kv_transfer_params`` exactly as vLLM's disaggregated serving
proxy does (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``, commit
030ea52effcb05071543c8c42b8f0145e94cee43): the prefill asks ``PROXY_PREFILL`` with
``max_tokens`` 1 and no ``min_tokens``; its final output's params go to the decode verbatim."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
import zmq

from services.vllm_worker.engine import VllmEngine, VllmHandle
from services.vllm_worker.kv_endpoints import loopback_sources
from services.vllm_worker.remote import RemoteOptions, RemoteVllmEngine
from shared.hashing import prefix_hashes
from shared.messages import AnyKvEvent, BlockStored, SamplingParams
from shared.worker.records import EngineError, EngineInput, EnginePhase
from tests.fakes.vllm_fakes import (
    FakeDpAsyncLLM,
    FakeKvPublisher,
    FakeNixl,
    FakeStack,
    FakeVllmServer,
    fake_inprocess_stack,
    fake_remote_stack,
    fake_sampling_params,
    inprocess_engine,
    until_subscribed,
)
from tests.integration.test_vllm_worker import expected_tokens, run_one
from tests.support import eventually_async

BS = 16
BIND_TRIES = 5
PROMPT = tuple(range(100, 140))  # 40 tokens: 3 blocks (2 full)
PROXY_PREFILL = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""``send_request_to_service``'s ``req_data["kv_transfer_params"]``, copied from the proxy."""

StackFactory = Callable[..., AbstractAsyncContextManager[FakeStack]]
STACKS = pytest.mark.parametrize(
    "make_stack", [fake_inprocess_stack, fake_remote_stack], ids=["inprocess", "remote"]
)


def phase_request(
    rid: str,
    phase: EnginePhase,
    params: dict[str, Any] | None = None,
    *,
    dp_rank: int = 0,
    prompt: tuple[int, ...] = PROMPT,
    **sampling: Any,
) -> EngineInput:
    return EngineInput(
        request_id=rid,
        token_ids=prompt,
        sampling=SamplingParams(**sampling),
        hash_seed=1337,
        phase=phase,
        kv_transfer_params=params,
        dp_rank=dp_rank,
    )


def stored_hashes(events: list[AnyKvEvent]) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


# --- prefill, then decode -----------------------------------------------------------------------


@STACKS
async def test_prefill_then_decode_pass_params_as_vllms_proxy(make_stack: StackFactory) -> None:
    nixl = FakeNixl()
    async with (
        make_stack(nixl=nixl, engine_id="prefill-engine") as prefill,
        make_stack(nixl=nixl, engine_id="decode-engine") as decode,
    ):
        # prefill: the proxy's request
        pre = await run_one(prefill, phase_request("r1", "prefill", max_tokens=30, min_tokens=3))
        (_, _, asked) = prefill.llm.requests[-1]
        assert asked.max_tokens == 1
        assert asked.min_tokens == 0
        assert asked.extra_args == {"kv_transfer_params": PROXY_PREFILL}
        if prefill.server is not None:
            body = prefill.server.bodies[-1]
            assert body["kv_transfer_params"] == PROXY_PREFILL
            assert body["stream"] is False
            assert "stream_options" not in body
            assert "min_tokens" not in body
        assert prefill.llm.dp_ranks == [None]  # one rank: no data_parallel_rank
        (last,) = pre.emissions
        assert last.done
        assert last.finish_reason == "length"
        assert len(last.token_ids) == 1
        assert last.prompt_tokens == len(PROMPT)
        (kept,) = nixl.kept  # the connector keeps the prompt's blocks for the decode side
        assert last.kv_transfer_params == {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [0, 1, 2],
            "remote_engine_id": "prefill-engine",
            "remote_request_id": kept[1],
            "remote_host": "localhost",
            "remote_port": 5600,
            "tp_size": 1,
        }
        params = last.kv_transfer_params
        handed = dict(params)

        # decode: the original request and the prefill's params, verbatim
        dec = await run_one(
            decode, phase_request("r1", "decode", params, max_tokens=30, min_tokens=3)
        )
        (_, _, asked) = decode.llm.requests[-1]
        assert asked.max_tokens == 30
        assert asked.min_tokens == 3
        assert nixl.reads == [("r1" if decode.server is None else "cmpl-1", handed, len(PROMPT))]
        if decode.server is not None:
            body = decode.server.bodies[-1]
            assert body["kv_transfer_params"] == handed
            assert body["stream"] is True
        assert params == handed  # the engine gave vLLM a copy: the connector marks its own
        assert nixl.kept == {}  # read: the prefill side freed them
        assert dec.failed == []
        assert dec.tokens("r1") == expected_tokens(PROMPT, 30)  # as aggregated
        # the decode worker reports the blocks it now holds
        await eventually_async(
            lambda: len(stored_hashes(decode.engine.kv_events)) >= 2,
            message="the decode worker stored fewer than two blocks",
        )
        assert stored_hashes(decode.engine.take_kv_events())[:2] == prefix_hashes(PROMPT, BS)


@STACKS
async def test_a_prefill_ended_by_eos_returns_no_params(make_stack: StackFactory) -> None:
    """NixlConnector returns params only for a length-capped prefill; the proxy then sends the
    decode request without any, and the decode instance prefills itself."""
    nixl = FakeNixl()
    async with (
        make_stack(nixl=nixl, eos_after=1) as prefill,
        make_stack(nixl=nixl) as decode,
    ):
        pre = await run_one(prefill, phase_request("r1", "prefill", max_tokens=8))
        (last,) = pre.emissions
        assert last.finish_reason == "stop"
        assert last.kv_transfer_params is None
        assert nixl.kept == {}
        await run_one(decode, phase_request("r1", "decode", last.kv_transfer_params, max_tokens=4))
        (_, _, asked) = decode.llm.requests[-1]
        assert asked.extra_args is None
        if decode.server is not None:
            assert "kv_transfer_params" not in decode.server.bodies[-1]
        assert nixl.reads == []


@STACKS
async def test_several_choices_are_refused_in_either_phase(make_stack: StackFactory) -> None:
    async with make_stack() as stack:
        phases: tuple[EnginePhase, ...] = ("prefill", "decode")
        for phase in phases:
            with pytest.raises(EngineError, match="n > 1"):
                stack.engine.check(phase_request("r", phase, {"x": 1}, n=2))
        stack.engine.check(phase_request("r", "both", n=2))


# --- data-parallel ranks ------------------------------------------------------------------------


@asynccontextmanager
async def dp_inprocess(dp_size: int) -> AsyncIterator[tuple[VllmEngine, FakeDpAsyncLLM]]:
    """A ``VllmEngine`` over ``dp_size`` fake engine cores whose publishers are vLLM's for an
    in-process engine: given ``loopback_sources``' endpoints, each rank connects its PUB socket
    to its own port (the worker's subscribers bind) and binds its replay socket."""
    endpoint, replay, sources = loopback_sources(dp_size, "kv")
    publishers = [
        FakeKvPublisher(endpoint=endpoint, replay_endpoint=replay, data_parallel_rank=rank)
        for rank in range(dp_size)
    ]
    llm = FakeDpAsyncLLM.build(dp_size, publishers=list(publishers))

    async def load() -> VllmHandle:
        return VllmHandle(
            client=llm,
            facts=llm.facts(),
            make_sampling_params=fake_sampling_params,
            kv_sources=sources,
            dp_size=dp_size,
            scheduler=llm.scheduler,
        )

    engine = VllmEngine(load)
    await engine.start()
    try:
        for rank, publisher in enumerate(publishers):
            await until_subscribed(engine, publisher, rank=rank)
        yield engine, llm
    finally:
        await engine.stop()
        for publisher in publishers:
            await asyncio.to_thread(publisher.shutdown)


async def test_in_process_ranks_get_their_requests_and_name_their_events() -> None:
    async with dp_inprocess(2) as (engine, llm):
        stack = FakeStack(
            engine=engine, llm=llm.ranks[0], publisher=None, facts=engine.handle.facts
        )
        sink = await run_one(stack, phase_request("a", "both", dp_rank=1, max_tokens=2))
        assert sink.tokens("a") == expected_tokens(PROMPT, 2)
        assert llm.dp_ranks == [1]
        assert [len(rank.requests) for rank in llm.ranks] == [0, 1]
        await eventually_async(
            lambda: len(stored_hashes(engine.kv_events)) >= 2,
            message="fewer than two stored blocks",
        )
        events = engine.take_kv_events()
        assert {e.dp_rank for e in events} == {1}
        assert stored_hashes(events)[:2] == prefix_hashes(PROMPT, BS)

        await run_one(stack, phase_request("b", "both", dp_rank=0, max_tokens=2))
        assert llm.dp_ranks == [1, 0]
        await eventually_async(
            lambda: len(stored_hashes(engine.kv_events)) >= 2,
            message="fewer than two stored blocks",
        )
        assert {e.dp_rank for e in engine.take_kv_events()} == {0}

        dumped = engine.kv_dump(with_tokens=False)
        assert sorted(e.dp_rank for e in dumped) == [0, 1]  # each rank's own cache
        assert all(list(e.block_hashes)[:2] == prefix_hashes(PROMPT, BS) for e in dumped)
        with pytest.raises(EngineError, match="rank 2"):
            engine.check(phase_request("c", "both", dp_rank=2))
        assert llm.scheduler.seen
        assert set(llm.scheduler.engines) == {0, 1}  # one stat logger per engine core


def _wildcard_publishers(dp_size: int) -> tuple[str, str, list[FakeKvPublisher]]:
    """``vllm serve --data-parallel-size N --kv-events-config '{"endpoint": "tcp://*:P", ...}'``:
    each rank binds P + rank on every interface. The ports were free when picked; one taken
    before the bind (an outgoing connection's ephemeral port, say) means new ports, a few times."""
    for attempt in range(BIND_TRIES):
        endpoint, replay, _ = loopback_sources(dp_size, "kv")
        port, rport = (int(e.rsplit(":", 1)[1]) for e in (endpoint, replay))
        publishers: list[FakeKvPublisher] = []
        try:
            publishers.extend(  # those made before a failed bind stay listed, to be shut down
                FakeKvPublisher(
                    endpoint=f"tcp://*:{port}",
                    replay_endpoint=f"tcp://*:{rport}",
                    data_parallel_rank=rank,
                )
                for rank in range(dp_size)
            )
        except zmq.ZMQError as exc:
            for publisher in publishers:
                publisher.shutdown()
            if exc.errno != errno.EADDRINUSE or attempt == BIND_TRIES - 1:
                raise
            continue
        return endpoint, replay, publishers
    raise AssertionError("unreachable")


async def test_remote_ranks_go_in_the_header_and_events_come_per_rank() -> None:
    endpoint, replay, publishers = await asyncio.to_thread(_wildcard_publishers, 2)
    llm = FakeDpAsyncLLM.build(2, publishers=list(publishers))
    server = FakeVllmServer(llm)
    await server.start()
    engine = RemoteVllmEngine(
        RemoteOptions(
            engine_url=server.url,
            block_size=BS,
            kv_blocks=64,
            model="fake-model",
            kv_events_endpoint=endpoint,
            kv_replay_endpoint=replay,
            kv_topic="kv",
            dp_size=2,
        )
    )
    try:
        facts = await engine.start()
        for rank, publisher in enumerate(publishers):
            await until_subscribed(engine, publisher, rank=rank)
        stack = FakeStack(engine=engine, llm=llm.ranks[0], publisher=None, facts=facts)
        sink = await run_one(stack, phase_request("a", "both", dp_rank=1, max_tokens=2))
        assert sink.tokens("a") == expected_tokens(PROMPT, 2)
        assert server.headers[-1]["x-data-parallel-rank"] == "1"
        assert llm.dp_ranks == [1]
        await eventually_async(
            lambda: len(stored_hashes(engine.kv_events)) >= 2,
            message="fewer than two stored blocks",
        )
        events = engine.take_kv_events()
        assert {e.dp_rank for e in events} == {1}
        assert stored_hashes(events)[:2] == prefix_hashes(PROMPT, BS)
        with pytest.raises(EngineError, match="rank 2"):
            engine.check(phase_request("c", "both", dp_rank=2))
    finally:
        await engine.stop()
        await server.stop()
        for publisher in publishers:
            await asyncio.to_thread(publisher.shutdown)


async def test_prefill_on_a_rank_names_that_ranks_side_channel() -> None:
    """NixlConnector's side channel port is the base plus the rank (``NixlConnectorScheduler``):
    a prefill on rank 1 says so in its params."""
    nixl = FakeNixl()
    llm = FakeDpAsyncLLM.build(2, nixl=nixl, engine_id="p")
    engine = inprocess_engine(llm)
    await engine.start()
    try:
        stack = FakeStack(
            engine=engine, llm=llm.ranks[0], publisher=None, facts=engine.handle.facts
        )
        sink = await run_one(stack, phase_request("r", "prefill", dp_rank=1, max_tokens=9))
        (last,) = sink.emissions
        assert last.kv_transfer_params is not None
        assert last.kv_transfer_params["remote_port"] == 5601
        assert llm.dp_ranks == [1]
    finally:
        await engine.stop()
