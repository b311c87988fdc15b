"""A tensor worker whose output does not hold what its shape and datatype say (FP32 shape [4]
with 0 bytes, or BYTES lengths that overrun): the gateway answers INTERNAL naming the output,
to the stock ``tritonclient`` and on a stream, instead of an OK response that the client then
fails to decode.

The gateway runs in-process on real NATS; ``tritonclient`` runs in a child interpreter
(``tritonclient.grpc`` and ``shared.kserve`` register the same protobuf names, see
``tests/e2e/test_grpc.py``).
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.gateway.apis.kserve import join_bytes
from shared import codec
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc
from shared.messages import (
    ModelCard,
    Tensor,
    TensorInfer,
    TensorModelSpec,
    TensorResult,
    TensorSpec,
    WorkerCard,
)
from shared.registry import WorkerRegistration, publish_model_card
from shared.subjects import Subjects
from tests.integration.gateway_support import WAIT_S, Gateway, gateway_config, served_gateway
from tests.support import eventually_awaited

ROOT = Path(__file__).resolve().parents[2]
MODEL = "bad-outputs"
SPEC = TensorModelSpec(
    inputs=(TensorSpec(name="INPUT0", datatype="INT32", shape=(-1,)),),
    outputs=(
        TensorSpec(name="OUTPUT0", datatype="FP32", shape=(4,)),
        TensorSpec(name="TEXT", datatype="BYTES", shape=(1,)),
    ),
)
GOOD = {
    "OUTPUT0": Tensor(
        name="OUTPUT0", datatype="FP32", shape=(4,), data=struct.pack("<4f", *[1] * 4)
    ),
    "TEXT": Tensor(name="TEXT", datatype="BYTES", shape=(1,), data=join_bytes([b"ok"])),
}
BAD = {
    "OUTPUT0": Tensor(name="OUTPUT0", datatype="FP32", shape=(4,), data=b""),
    "TEXT": Tensor(name="TEXT", datatype="BYTES", shape=(1,), data=b"\x09\x00\x00\x00ok"),
}
TRITON_INFER = """
import json, sys
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

target, model, output = sys.argv[1:4]
client = grpcclient.InferenceServerClient(target)
tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
tensor.set_data_from_numpy(np.array([7], dtype=np.int32))
try:
    result = client.infer(model, [tensor], outputs=[grpcclient.InferRequestedOutput(output)])
except InferenceServerException as exc:
    print(json.dumps({"status": str(exc.status()), "message": exc.message()}))
    sys.exit(0)
try:
    value = result.as_numpy(output)
except Exception as exc:  # what a client sees when an OK answer cannot be decoded
    print(json.dumps({"status": "OK", "message": "decode failed: " + repr(exc)}))
    sys.exit(0)
print(json.dumps({"status": "OK", "message": repr(value.tolist())}))
"""


class FixedOutputsWorker:
    """A tensor worker that answers every request with ``outputs``, whatever it was asked."""

    def __init__(self, nc: Client, subjects: Subjects, outputs: dict[str, Tensor]) -> None:
        self._nc = nc
        self._subjects = subjects
        self.outputs = outputs
        self.worker_id = "bad1"

    async def start(self) -> None:
        await self._nc.subscribe(self._subjects.tensor_infer(self.worker_id), cb=self._on)
        await self._nc.flush()

    async def _on(self, msg: Msg) -> None:
        infer = codec.decode(msg.data, TensorInfer)
        result = TensorResult(
            request_id=infer.request_id,
            model=infer.model,
            outputs=tuple(self.outputs.values()),
            id=infer.id,
        )
        await self._nc.publish(infer.reply_to, codec.encode(result))


@pytest.fixture
async def gateway(nats_url: str, subjects: Subjects) -> AsyncIterator[Gateway]:
    config = gateway_config(nats_url, subjects, 5.0, shutdown_grace_s=1.0)
    async with served_gateway(config, serve_grpc=True) as gateway:
        yield gateway


@pytest.fixture
async def worker(
    gateway: Gateway, nc: Client, subjects: Subjects
) -> AsyncIterator[FixedOutputsWorker]:
    """``MODEL`` registered with one live worker that answers ``BAD`` until told otherwise."""
    worker = FixedOutputsWorker(nc, subjects, BAD)
    await worker.start()
    card = ModelCard(model=MODEL, context_length=0, kind="tensor", tensor_spec=SPEC)
    await publish_model_card(nc.jetstream(), subjects, card)
    registration = WorkerRegistration(
        nc.jetstream(), subjects, WorkerCard(worker_id=worker.worker_id, model=MODEL, kind="t")
    )
    await registration.start()
    try:
        async with grpc.aio.insecure_channel(gateway.grpc_target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            await _until_ready(stub)
        yield worker
    finally:
        await registration.stop()


async def _until_ready(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    async def ready() -> bool:
        return bool((await stub.ModelReady(pb.ModelReadyRequest(name=MODEL))).ready)

    await eventually_awaited(ready, timeout_s=WAIT_S, message=f"{MODEL} never became ready")


async def _triton_infer(gateway: Gateway, output: str) -> dict[str, str]:
    """``tritonclient``'s ModelInfer of ``MODEL`` asking for ``output``: status and message."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        TRITON_INFER,
        gateway.grpc_target,
        MODEL,
        output,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    found: dict[str, str] = json.loads(out)
    return found


@pytest.mark.parametrize("output", ["OUTPUT0", "TEXT"])
async def test_tritonclient_gets_internal_naming_a_badly_sized_output(
    gateway: Gateway, worker: FixedOutputsWorker, output: str
) -> None:
    answer = await _triton_infer(gateway, output)
    assert answer["status"] == "StatusCode.INTERNAL"
    assert f"`{output}`" in answer["message"]


async def test_tritonclient_decodes_well_sized_outputs(
    gateway: Gateway, worker: FixedOutputsWorker
) -> None:
    worker.outputs = GOOD
    answer = await _triton_infer(gateway, "OUTPUT0")
    assert answer == {"status": "OK", "message": "[1.0, 1.0, 1.0, 1.0]"}


async def test_a_stream_request_gets_an_error_naming_the_output_and_the_stream_goes_on(
    gateway: Gateway, worker: FixedOutputsWorker
) -> None:
    request = pb.ModelInferRequest(model_name=MODEL, id="s1")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    request.raw_input_contents.append(struct.pack("<i", 7))
    async with grpc.aio.insecure_channel(gateway.grpc_target) as channel:
        call = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(timeout=WAIT_S * 2)
        await call.write(request)
        failed = await asyncio.wait_for(call.read(), WAIT_S)
        worker.outputs = GOOD
        await call.write(request)
        answered = await asyncio.wait_for(call.read(), WAIT_S)
        await call.done_writing()
    assert "`OUTPUT0`" in failed.error_message
    assert failed.infer_response.id == "s1"
    assert answered.error_message == ""
    assert [o.name for o in answered.infer_response.outputs] == ["OUTPUT0", "TEXT"]
