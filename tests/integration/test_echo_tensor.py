"""The echo tensor worker against a real nats-server: cards in the registry, echo, deregister."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from services.echo_tensor.config import EchoTensorConfig
from services.echo_tensor.service import EchoTensorService, build_service
from shared import codec
from shared.kserve import model_config_pb2 as mc
from shared.messages import RequestFailed, Tensor, TensorInfer, TensorResult, TensorSpec
from shared.registry import ModelFiles, WorkerDirectory
from shared.subjects import Subjects
from tests.support import eventually_async

GATEWAY_ID = "gw1"
TIMEOUT_S = 10.0
REPO = Path(__file__).resolve().parents[2]

INT32 = Tensor(
    name="INPUT0", datatype="INT32", shape=(4,), data=struct.pack("<4i", 1, -2, 3, 2**31 - 1)
)
FP32 = Tensor(
    name="INPUT1", datatype="FP32", shape=(2, 2), data=struct.pack("<4f", 0.5, -1.25, 3e38, 0)
)
BYTES = Tensor(
    name="INPUT2",
    datatype="BYTES",
    shape=(3,),
    data=b"".join(struct.pack("<I", len(s)) + s for s in (b"hi", b"", "wörld 🙂".encode())),
)


async def start_echo(
    nats_url: str, subjects: Subjects, **options: Any
) -> tuple[EchoTensorService, Client]:
    config = EchoTensorConfig(
        nats_url=nats_url, namespace=subjects.namespace, worker_id="e1", **options
    )
    client = await nats.connect(nats_url)
    service = build_service(config, client)
    await service.start()
    return service, client


@pytest.fixture
async def start(nats_url: str, subjects: Subjects) -> AsyncIterator[Callable[..., Any]]:
    """Start in-process echo workers, each on its own connection; stop and drain them after."""
    started: list[tuple[EchoTensorService, Client]] = []

    async def start_one(**options: Any) -> EchoTensorService:
        service, client = await start_echo(nats_url, subjects, **options)
        started.append((service, client))
        return service

    yield start_one
    for service, client in started:
        await service.stop()
        await client.drain()


async def infer(nc: Client, subjects: Subjects, worker_id: str, request: TensorInfer) -> Any:
    """Publish ``request`` to the worker and return what its reply subject gets."""
    sub = await nc.subscribe(request.reply_to)
    await nc.publish(subjects.tensor_infer(worker_id), codec.encode(request))
    msg = await sub.next_msg(timeout=TIMEOUT_S)
    await sub.unsubscribe()
    return codec.GATEWAY_EVENTS.decode(msg.data)


def tensor_infer(subjects: Subjects, *inputs: Tensor, model: str = "echo") -> TensorInfer:
    request_id = uuid.uuid4().hex
    return TensorInfer(
        request_id=request_id,
        model=model,
        reply_to=subjects.reply(GATEWAY_ID, request_id),
        inputs=inputs,
        id="client-1",
        parameters={"k": "v"},
    )


async def test_registers_a_tensor_model_card_with_its_spec(
    nc: Client, subjects: Subjects, start: Callable[..., Any]
) -> None:
    service = await start()
    card = await ModelFiles(nc.jetstream(), subjects).card("echo")
    assert card is not None
    assert (card.kind, card.files, card.tensor_spec) == ("tensor", (), service.spec)
    assert card.tensor_spec is not None
    assert card.tensor_spec.inputs[2] == TensorSpec(
        name="INPUT2", datatype="BYTES", shape=(-1,), optional=True
    )


async def test_registers_the_triton_config_serialized_in_the_card(
    nc: Client, subjects: Subjects, start: Callable[..., Any], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "name": "echo",
                "platform": "custom",
                "input": [{"name": "input", "data_type": "TYPE_STRING", "dims": [-1]}],
                "output": [{"name": "output", "data_type": "TYPE_STRING", "dims": [-1]}],
            }
        )
    )
    await start(triton_model_config=path)
    card = await ModelFiles(nc.jetstream(), subjects).card("echo")
    assert card is not None
    assert card.tensor_spec is not None
    expected = mc.ModelConfig(name="echo", platform="custom")
    expected.input.add(name="input", data_type=mc.TYPE_STRING, dims=[-1])
    expected.output.add(name="output", data_type=mc.TYPE_STRING, dims=[-1])
    assert card.tensor_spec.triton_model_config == expected.SerializeToString(deterministic=True)
    assert [s.name for s in card.tensor_spec.outputs] == ["output"]


async def test_the_worker_card_is_in_the_directory(
    nc: Client, subjects: Subjects, start: Callable[..., Any]
) -> None:
    await start()
    directory = WorkerDirectory(nc.jetstream(), subjects)
    await directory.start()
    try:
        [card] = directory.live("echo")
    finally:
        await directory.stop()
    assert (card.worker_id, card.model, card.kind) == ("e1", "echo", "echo_tensor")


async def test_echoes_int32_fp32_and_bytes_byte_identical(
    nc: Client, subjects: Subjects, start: Callable[..., Any]
) -> None:
    await start()
    request = tensor_infer(subjects, INT32, FP32, BYTES)
    result = await infer(nc, subjects, "e1", request)
    assert isinstance(result, TensorResult)
    assert [(t.name, t.datatype, t.shape, t.data) for t in result.outputs] == [
        ("OUTPUT0", "INT32", (4,), INT32.data),
        ("OUTPUT1", "FP32", (2, 2), FP32.data),
        ("OUTPUT2", "BYTES", (3,), BYTES.data),
    ]
    assert (result.request_id, result.model, result.id, result.parameters) == (
        request.request_id,
        "echo",
        "client-1",
        {"k": "v"},
    )


async def test_another_model_is_model_not_found(
    nc: Client, subjects: Subjects, start: Callable[..., Any]
) -> None:
    await start()
    request = tensor_infer(subjects, INT32, model="other")
    failed = await infer(nc, subjects, "e1", request)
    assert isinstance(failed, RequestFailed)
    assert (failed.request_id, failed.code, failed.status) == (
        request.request_id,
        "model_not_found",
        404,
    )


async def test_stop_removes_the_worker_card(nats_url: str, nc: Client, subjects: Subjects) -> None:
    service, client = await start_echo(nats_url, subjects)
    directory = WorkerDirectory(nc.jetstream(), subjects)
    await directory.start()
    try:
        assert [c.worker_id for c in directory.live("echo")] == ["e1"]
        await service.stop()
        await eventually_async(
            lambda: directory.live("echo") == [],
            timeout_s=TIMEOUT_S,
            message="the stopped worker's card is still live",
        )
    finally:
        await directory.stop()
        await client.drain()


async def test_sigterm_deregisters_the_worker_process(
    nats_url: str, nc: Client, subjects: Subjects, tmp_path: Path
) -> None:
    """``python -m services.echo_tensor`` end to end: registers, then SIGTERM removes its card."""
    env = {**os.environ, "JETSERVE_NATS_URL": nats_url, "JETSERVE_NAMESPACE": subjects.namespace}
    log_path = tmp_path / "echo.log"
    directory = WorkerDirectory(nc.jetstream(), subjects)
    await directory.start()
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "services.echo_tensor", "--worker-id", "e2"),
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        await eventually_async(
            lambda: [c.worker_id for c in directory.live("echo")] == ["e2"],
            timeout_s=TIMEOUT_S,
            message="the worker process never registered",
        )
        result = await infer(nc, subjects, "e2", tensor_infer(subjects, BYTES))
        assert isinstance(result, TensorResult)
        proc.send_signal(signal.SIGTERM)
        await eventually_async(
            lambda: directory.live("echo") == [],
            timeout_s=TIMEOUT_S,
            message="SIGTERM did not remove the worker's card",
        )
        assert await asyncio.wait_for(proc.wait(), TIMEOUT_S) == 0
    finally:
        await directory.stop()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
            print(log_path.read_text())
