"""The worker contract (``tests.contract.engine_contract``) against the vLLM worker with vLLM's own
classes wherever they run without a GPU (``make test-vllm``; skipped without vllm):

- KV events: vLLM's ``ZmqEventPublisher`` sends vLLM's ``KVEventBatch`` of ``BlockStored`` /
  ``BlockRemoved`` / ``AllBlocksCleared`` (``RealKvPublisher``) instead of ``FakeKvPublisher``;
- the in-process ``VllmEngine`` builds its sampling parameters with ``loader.make_sampling_params``
  (a real ``vllm.SamplingParams``) instead of ``fake_sampling_params``.

The engine itself is still ``FakeAsyncLLM`` (behind ``FakeVllmServer`` for "vllm-remote"):
vLLM's real ``AsyncLLM`` needs a GPU. Same checks and worker process as
``tests/integration/test_engine_contract.py``, on a real nats-server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

vllm = pytest.importorskip("vllm")

from services.mocker.service import ModelInfo  # noqa: E402
from services.vllm_worker.engine import VllmEngine, VllmHandle  # noqa: E402
from services.vllm_worker.kv_endpoints import KvSource  # noqa: E402
from services.vllm_worker.loader import make_sampling_params  # noqa: E402
from shared.subjects import Subjects  # noqa: E402
from tests.contract.engine_contract import (  # noqa: E402
    CHECKS,
    WorkerUnderTest,
    check_kv_events,
    check_streaming_and_max_tokens,
)
from tests.fakes.vllm_fakes import (  # noqa: E402
    FakeAsyncLLM,
    FakeVllmServer,
    remote_engine,
    until_subscribed,
)
from tests.integration.test_engine_contract import _engine_process  # noqa: E402
from tests.vllm_real.real_publisher import RealKvPublisher  # noqa: E402

pytestmark = pytest.mark.integration


@dataclass
class RealStarted:
    """The worker under test, its engine's block size, and the fake engine and real publisher
    behind it."""

    worker: WorkerUnderTest
    block_size: int
    llm: FakeAsyncLLM
    publisher: RealKvPublisher


Maker = Callable[[str, Subjects, ModelInfo], AbstractAsyncContextManager[RealStarted]]


@asynccontextmanager
async def _vllm(nats_url: str, subjects: Subjects, model: ModelInfo) -> AsyncIterator[RealStarted]:
    """In-process: ``VllmEngine`` over ``FakeAsyncLLM``, real publisher, real SamplingParams."""
    publisher = RealKvPublisher()
    llm = FakeAsyncLLM(publisher=publisher)

    async def load() -> VllmHandle:
        return VllmHandle(
            client=llm,
            facts=llm.facts(),
            make_sampling_params=make_sampling_params,
            kv_sources=(
                KvSource(
                    endpoint=publisher.endpoint,
                    replay_endpoint=publisher.replay_endpoint,
                    topic=publisher.topic,
                ),
            ),
            scheduler=llm.scheduler,
        )

    engine = VllmEngine(load)
    try:
        await engine.start()
        await until_subscribed(engine, publisher)
        process = _engine_process(nats_url, subjects, model, engine, "contract-vllm", "vllm")
        async with process as (worker, block_size):
            yield RealStarted(worker, block_size, llm, publisher)
    finally:
        await engine.stop()
        await asyncio.to_thread(publisher.shutdown)


@asynccontextmanager
async def _vllm_remote(
    nats_url: str, subjects: Subjects, model: ModelInfo
) -> AsyncIterator[RealStarted]:
    """Remote: ``RemoteVllmEngine`` → ``FakeVllmServer`` over HTTP, real publisher."""
    publisher = RealKvPublisher()
    llm = FakeAsyncLLM(publisher=publisher)
    server = FakeVllmServer(llm)
    await server.start()
    engine = remote_engine(server, metrics_interval_s=0.0)
    try:
        await engine.start()
        await until_subscribed(engine, publisher)
        process = _engine_process(
            nats_url, subjects, model, engine, "contract-vllm-remote", "vllm-remote"
        )
        async with process as (worker, block_size):
            yield RealStarted(worker, block_size, llm, publisher)
    finally:
        await engine.stop()
        await server.stop()
        await asyncio.to_thread(publisher.shutdown)


ENGINES: dict[str, Maker] = {"vllm": _vllm, "vllm-remote": _vllm_remote}


@pytest.fixture(params=sorted(ENGINES))
async def worker(
    request: pytest.FixtureRequest, nats_url: str, subjects: Subjects, model_info: ModelInfo
) -> AsyncIterator[RealStarted]:
    async with ENGINES[request.param](nats_url, subjects, model_info) as started:
        yield started


@pytest.mark.parametrize("check", sorted(CHECKS))
async def test_contract(worker: RealStarted, check: str) -> None:
    run: Callable[[WorkerUnderTest], Awaitable[Any]] = CHECKS[check]
    await run(worker.worker)


async def test_kv_events(worker: RealStarted) -> None:
    await check_kv_events(worker.worker, worker.block_size)
    assert worker.publisher.published > 0


async def test_vllms_own_classes_ran(worker: RealStarted) -> None:
    """What ran was vLLM's: the engine got a real ``vllm.SamplingParams`` (in-process; the
    remote one gets what ``FakeVllmServer`` parses from HTTP), and the events came through
    vLLM's publisher."""
    await check_streaming_and_max_tokens(worker.worker)
    assert worker.llm.requests
    params = worker.llm.requests[-1][2]
    if worker.worker.kind == "vllm":
        assert isinstance(params, vllm.SamplingParams)
        assert params.output_kind.name == "DELTA"
    assert type(worker.publisher._publisher).__module__ == "vllm.distributed.kv_events"
    assert worker.publisher.published > 0
