"""The gateway's model cards follow the registry (real nats-server, gateway in-process): a tensor
model republished with another spec (a worker upgraded with new inputs) gets the new metadata,
config and input validation without a gateway restart."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

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
from shared.registry import ModelFiles, WorkerRegistration, publish_model_card
from shared.subjects import Subjects
from tests.integration.gateway_support import WAIT_S, gateway_config, served_gateway
from tests.support import eventually_awaited

Stub = pb_grpc.GRPCInferenceServiceStub
MODEL = "upgraded"
V1 = TensorModelSpec(
    inputs=(TensorSpec(name="INPUT0", datatype="INT32", shape=(-1,)),),
    outputs=(TensorSpec(name="OUTPUT0", datatype="INT32", shape=(-1,)),),
)
V2 = TensorModelSpec(
    inputs=(TensorSpec(name="IMAGE", datatype="FP32", shape=(2,)),),
    outputs=(TensorSpec(name="OUTPUT0", datatype="FP32", shape=(2,)),),
)


def card(spec: TensorModelSpec) -> ModelCard:
    return ModelCard(model=MODEL, context_length=0, kind="tensor", tensor_spec=spec)


def echo_worker(nc: Client) -> Callable[[Msg], Awaitable[None]]:
    """The worker: its first input back as ``OUTPUT0`` (whatever the spec of the day says)."""

    async def on_infer(msg: Msg) -> None:
        await _echo(nc, msg)

    return on_infer


async def _echo(nc: Client, msg: Msg) -> None:
    infer = codec.decode(msg.data, TensorInfer)
    first = infer.inputs[0]
    output = Tensor(name="OUTPUT0", datatype=first.datatype, shape=first.shape, data=first.data)
    result = TensorResult(request_id=infer.request_id, model=infer.model, outputs=(output,))
    await nc.publish(infer.reply_to, codec.encode(result))


@pytest.fixture
async def stub(nats_url: str, subjects: Subjects, nc: Client) -> AsyncIterator[Stub]:
    """A gateway over gRPC that has served ``MODEL`` (spec ``V1``) from its live worker."""
    await publish_model_card(nc.jetstream(), subjects, card(V1))
    worker = WorkerCard(worker_id="w1", model=MODEL, kind="tensor")
    await nc.subscribe(subjects.tensor_infer(worker.worker_id), cb=echo_worker(nc))
    registration = WorkerRegistration(nc.jetstream(), subjects, worker)
    await registration.start()
    config = gateway_config(nats_url, subjects, 5.0, shutdown_grace_s=1.0)
    try:
        async with (
            served_gateway(config, serve_grpc=True) as gateway,
            grpc.aio.insecure_channel(gateway.grpc_target) as channel,
        ):
            found = pb_grpc.GRPCInferenceServiceStub(channel)
            await eventually_awaited(
                lambda: _ready(found), timeout_s=WAIT_S, message="the model never became ready"
            )
            yield found
    finally:
        await registration.stop()


async def _ready(stub: Stub) -> bool:
    return bool((await stub.ModelReady(pb.ModelReadyRequest(name=MODEL))).ready)


async def _input_names(stub: Stub) -> list[str]:
    metadata = await stub.ModelMetadata(pb.ModelMetadataRequest(name=MODEL))
    return [t.name for t in metadata.inputs]


def _request(name: str, datatype: str, data: bytes, shape: list[int]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(data)
    return request


V1_REQUEST = _request("INPUT0", "INT32", struct.pack("<i", 5), [1])
V2_REQUEST = _request("IMAGE", "FP32", struct.pack("<2f", 0.5, 1.5), [2])


async def _status(stub: Stub, request: pb.ModelInferRequest) -> grpc.StatusCode:
    try:
        await stub.ModelInfer(request, timeout=WAIT_S)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_a_republished_spec_replaces_metadata_config_and_input_validation(
    stub: Stub, nc: Client, subjects: Subjects
) -> None:
    assert await _input_names(stub) == ["INPUT0"]
    assert [await _status(stub, r) for r in (V1_REQUEST, V2_REQUEST)] == [
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
    ]
    await publish_model_card(nc.jetstream(), subjects, card(V2))

    async def shows_v2() -> bool:
        return await _input_names(stub) == ["IMAGE"]

    await eventually_awaited(
        shows_v2, timeout_s=WAIT_S, message="the gateway never showed the republished inputs"
    )
    config = (await stub.ModelConfig(pb.ModelConfigRequest(name=MODEL))).config
    assert [(i.name, list(i.dims)) for i in config.input] == [("IMAGE", [2])]
    assert [await _status(stub, r) for r in (V1_REQUEST, V2_REQUEST)] == [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OK,
    ]


async def test_files_watched_before_the_store_exists_read_a_republished_card(
    nc: Client, subjects: Subjects
) -> None:
    """A gateway usually starts before any worker: it watches the store once there is one."""
    files = ModelFiles(nc.jetstream(), subjects)
    await files.watch()
    try:
        for spec in (V1, V2):
            await publish_model_card(nc.jetstream(), subjects, card(spec))

            async def reads(spec: TensorModelSpec = spec) -> bool:
                found = await files.card(MODEL)
                return found is not None and found.tensor_spec == spec

            await eventually_awaited(
                reads, timeout_s=WAIT_S, message=f"the store never gave the card of {spec}"
            )
    finally:
        await files.stop()
