"""The worker contract (``tests.contract.engine_contract``) against every engine ``make test``
can run: the mocker, and vLLM's in-process and remote engines driven by fakes that follow vLLM's
interfaces (``tests.fakes.vllm_fakes``). The transformers engine runs the same checks in
``tests/engines`` (``make test-engines``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

from services.mocker.config import MockerConfig
from services.mocker.service import Mocker, ModelInfo
from shared.bus import connect
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.subjects import Subjects
from shared.worker.engine import WorkerEngine
from shared.worker.process import WorkerProcess
from tests.contract.engine_contract import CHECKS, WorkerUnderTest, check_kv_events
from tests.fakes.vllm_fakes import fake_inprocess_engine, fake_remote_engine

Started = tuple[WorkerUnderTest, int]
"""The worker under test and its engine's block size."""
Maker = Callable[[str, Subjects, ModelInfo], AbstractAsyncContextManager[Started]]


@asynccontextmanager
async def _mocker(nats_url: str, subjects: Subjects, model: ModelInfo) -> AsyncIterator[Started]:
    # Real-time pacing (speedup 1): a long request is still running when its cancel arrives.
    config = MockerConfig(
        nats_url=nats_url,
        namespace=subjects.namespace,
        model_path=model.model_dir,
        worker_id="contract-mocker",
        speedup_ratio=1.0,
        shutdown_grace_s=1.0,
    )
    nc = await connect(nats_url, name="contract-mocker")
    mocker = Mocker(config, nc, model=model)
    await mocker.start()
    try:
        yield (
            WorkerUnderTest(nc, subjects, "contract-mocker", DEFAULT_MODEL_NAME, kind="mocker"),
            config.block_size,
        )
    finally:
        await mocker.stop()
        await nc.drain()


@asynccontextmanager
async def _engine_process(
    nats_url: str,
    subjects: Subjects,
    model: ModelInfo,
    engine: WorkerEngine,
    worker_id: str,
    kind: str,
) -> AsyncIterator[Started]:
    """A ``WorkerProcess`` with one worker around an already made ``engine``."""
    config = MockerConfig(
        nats_url=nats_url,
        namespace=subjects.namespace,
        model_path=model.model_dir,
        worker_id=worker_id,
        shutdown_grace_s=1.0,
    )
    nc = await connect(nats_url, name=worker_id)
    process = WorkerProcess(config, nc, lambda _: engine, model_dir=model.model_dir)
    await process.start()
    facts = await engine.start()  # started already: the same facts again
    try:
        yield WorkerUnderTest(nc, subjects, worker_id, DEFAULT_MODEL_NAME, kind), facts.block_size
    finally:
        await process.stop()
        await nc.drain()


@asynccontextmanager
async def _vllm(nats_url: str, subjects: Subjects, model: ModelInfo) -> AsyncIterator[Started]:
    async with (
        fake_inprocess_engine() as engine,
        _engine_process(nats_url, subjects, model, engine, "contract-vllm", "vllm") as started,
    ):
        yield started


@asynccontextmanager
async def _vllm_remote(
    nats_url: str, subjects: Subjects, model: ModelInfo
) -> AsyncIterator[Started]:
    async with (
        fake_remote_engine() as engine,
        _engine_process(
            nats_url, subjects, model, engine, "contract-vllm-remote", "vllm-remote"
        ) as started,
    ):
        yield started


ENGINES: dict[str, Maker] = {"mocker": _mocker, "vllm": _vllm, "vllm-remote": _vllm_remote}


@pytest.fixture(params=sorted(ENGINES))
async def worker(
    request: pytest.FixtureRequest, nats_url: str, subjects: Subjects, model_info: ModelInfo
) -> AsyncIterator[Started]:
    async with ENGINES[request.param](nats_url, subjects, model_info) as started:
        yield started


@pytest.mark.parametrize("check", sorted(CHECKS))
async def test_contract(worker: Started, check: str) -> None:
    under_test, _ = worker
    run: Callable[[WorkerUnderTest], Awaitable[Any]] = CHECKS[check]
    await run(under_test)


async def test_kv_events(worker: Started) -> None:
    under_test, block_size = worker
    await check_kv_events(under_test, block_size)
