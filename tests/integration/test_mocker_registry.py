"""A mocker subprocess in the registry: SIGKILL → card expires by TTL; SIGTERM → gone at once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from shared.model_dir import DEFAULT_MODEL_NAME, ensure_default_model_dir
from shared.registry import ModelFiles, WorkerDirectory
from shared.subjects import Subjects
from tests.support import eventually_async

MODEL = DEFAULT_MODEL_NAME
REPO = Path(__file__).resolve().parents[2]
HANG_S = 60.0
"""A wait only a hang runs into (a new process imports, loads its model and registers)."""


@pytest.fixture
def start_mocker(
    nats_url: str, subjects: Subjects, tmp_path: Path
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``python -m services.mocker`` subprocesses; stop only the pids started here."""
    model_dir = ensure_default_model_dir(tmp_path / "model")
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(worker_id: str, *args: str) -> subprocess.Popen[bytes]:
        log_path = tmp_path / f"{worker_id}.log"
        env = {
            **os.environ,
            "JETSERVE_NATS_URL": nats_url,
            "JETSERVE_NAMESPACE": subjects.namespace,
        }
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.mocker",
                    "--worker-id",
                    worker_id,
                    "--model-path",
                    str(model_dir),
                    "--speedup-ratio",
                    "0",
                    *args,
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append((proc, log_path))
        return proc

    yield start
    for proc, log_path in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.returncode not in (0, -signal.SIGKILL):
            print(log_path.read_text())


async def test_killed_mocker_card_expires_by_ttl(
    nc: Client, subjects: Subjects, start_mocker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    ttl_s = 2.0
    directory = WorkerDirectory(nc.jetstream(), subjects, ttl_s=ttl_s)
    proc = start_mocker("k1", "--worker-ttl-s", str(ttl_s))
    await directory.start()
    try:
        await eventually_async(
            lambda: MODEL in directory.models(),
            timeout_s=HANG_S,
            interval_s=0.05,
            message="the mocker never registered its model",
        )
        assert [c.worker_id for c in directory.live(MODEL)] == ["k1"]
        card = await ModelFiles(nc.jetstream(), subjects).card(MODEL)
        assert card is not None
        assert card.eos_token_ids
        proc.send_signal(signal.SIGKILL)  # no chance to delete its card: only the TTL ends it
        proc.wait(timeout=HANG_S)
        await eventually_async(
            lambda: not directory.live(MODEL),
            timeout_s=HANG_S,
            interval_s=0.05,
            message="the killed worker's card outlived its TTL",
        )
    finally:
        await directory.stop()


async def test_sigterm_deletes_the_card_at_once(
    nc: Client, subjects: Subjects, start_mocker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    ttl_s = 3600.0  # far past the wait, so only the explicit delete can remove the card
    directory = WorkerDirectory(nc.jetstream(), subjects, ttl_s=ttl_s)
    proc = start_mocker("t1", "--worker-ttl-s", str(ttl_s))
    await directory.start()
    try:
        await eventually_async(
            lambda: MODEL in directory.models(),
            timeout_s=HANG_S,
            interval_s=0.05,
            message="the mocker never registered its model",
        )
        proc.send_signal(signal.SIGTERM)
        await eventually_async(
            lambda: not directory.live(MODEL),
            timeout_s=HANG_S,
            interval_s=0.05,
            message="SIGTERM did not remove the worker's card",
        )
    finally:
        await directory.stop()
    assert await asyncio.to_thread(proc.wait, HANG_S) == 0
