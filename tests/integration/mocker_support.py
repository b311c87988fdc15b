"""An in-process mocker on a real nats-server, for the integration tests that need workers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from services.mocker.config import MockerConfig
from services.mocker.service import Mocker, ModelInfo
from shared.bus import connect
from shared.subjects import Subjects


@asynccontextmanager
async def running_mocker(
    nats_url: str,
    subjects: Subjects,
    model: ModelInfo,
    *,
    ready: Callable[[Mocker], Awaitable[None]] | None = None,
    **overrides: Any,
) -> AsyncIterator[Mocker]:
    """A started mocker (no simulated delay unless ``overrides`` say so); ``ready`` is awaited
    after start, e.g. to wait until its workers answer."""
    settings: dict[str, Any] = {"speedup_ratio": 0.0, "shutdown_grace_s": 1.0, **overrides}
    config = MockerConfig(
        nats_url=nats_url, namespace=subjects.namespace, model_path=model.model_dir, **settings
    )
    nc = await connect(nats_url, name="test-mocker")
    mocker = Mocker(config, nc, model=model)
    await mocker.start()
    try:
        if ready is not None:
            await ready(mocker)
        yield mocker
    finally:
        await mocker.stop()
        await nc.drain()
