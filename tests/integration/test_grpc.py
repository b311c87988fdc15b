"""The gateway's gRPC front end (KServe v2 / Triton) in-process against real NATS.

The gateway app runs under uvicorn with its gRPC server in the same loop; clients are our own
generated stub over a real ``grpc.aio`` channel (``tritonclient`` cannot share a process with
``shared.kserve``; the e2e tier drives it). LLM requests go to a fake preprocessor+formatter
answering in the ``text`` output format, or through the real pipeline (preprocessor, router,
formatter, mocker, all in-process); tensor requests to a tiny worker answering ``TensorInfer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import nats
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc  # type: ignore[import-untyped]
from nats.aio.client import Client
from nats.aio.msg import Msg
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from services.formatter.config import FormatterConfig
from services.formatter.service import build_service
from services.mocker.service import ModelInfo
from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.service import serving
from services.router.config import RouterConfig
from services.router.service import Router
from shared import codec
from shared.bus import connect
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc
from shared.kserve import model_config_pb2 as mc
from shared.kserve_wire import TextResponses, usage_parameters
from shared.messages import (
    Cancel,
    ModelCard,
    Preprocess,
    RequestFailed,
    ResponseChunk,
    Tensor,
    TensorInfer,
    TensorModelSpec,
    TensorResult,
    TensorSpec,
    WorkerCard,
)
from shared.registry import WorkerRegistration, publish_model
from shared.subjects import Subjects
from tests.integration import mocker_support
from tests.integration.gateway_support import (
    WAIT_S,
    FakeDownstream,
    Gateway,
    Send,
    gateway_config,
    served_gateway,
    until,
)
from tests.support import eventually_awaited, free_port

MODEL = "mock-model"
TENSOR_MODEL = "echo"
REQUEST_TIMEOUT_S = 2.0
HANG_S = 30.0
"""A wait only a hang runs into."""
SERVICE = "inference.GRPCInferenceService"


# --- KServe helpers ------------------------------------------------------------------------------


def bytes_raw(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def text_request(
    prompt: str = "Say hello",
    *,
    request_id: str = "",
    streaming: bool | None = None,
    model: str = MODEL,
    typed: bool = False,
    **params: Any,
) -> pb.ModelInferRequest:
    """An LLM request as tritonclient builds one (raw contents unless ``typed``)."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    text = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    if typed:
        text.contents.bytes_contents.append(prompt.encode())
    else:
        request.raw_input_contents.append(bytes_raw(prompt.encode()))
    if streaming is not None:
        flag = request.inputs.add(name="streaming", datatype="BOOL", shape=[1])
        if typed:
            flag.contents.bool_contents.append(streaming)
        else:
            request.raw_input_contents.append(bytes([streaming]))
    for key, value in params.items():
        if isinstance(value, float):
            request.parameters[key].double_param = value
        else:
            request.parameters[key].int64_param = value
    return request


def outputs_of(response: pb.ModelInferResponse) -> dict[str, bytes]:
    """Each BYTES output's one element."""
    found = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        (length,) = struct.unpack_from("<I", raw)
        assert len(raw) == 4 + length
        found[tensor.name] = raw[4:]
    return found


# --- fakes ---------------------------------------------------------------------------------------


def framing(request: Preprocess) -> TextResponses:
    """What the formatter frames a streamed request's responses with (``kserve`` format)."""
    assert request.output.format == "kserve"
    assert request.output.kserve is not None
    kserve = request.output.kserve
    return TextResponses(request.model, kserve.id, kserve.outputs)


async def hello_world(request: Preprocess, send: Send) -> None:
    """What the formatter sends: streamed, ``kserve``-framed responses (the text, then the
    finish with the token counts); not streamed, the whole text (``text`` format)."""
    rid = request.request_id
    if not request.output.stream:
        done = ResponseChunk(
            request_id=rid,
            data=b"Hello world",
            done=True,
            prompt_tokens=3,
            completion_tokens=2,
            finish_reason="stop",
        )
        await send(done)
        return
    responses = framing(request)
    await send(ResponseChunk(request_id=rid, data=responses.delta(b"Hello")))
    await asyncio.sleep(0.02)
    await send(ResponseChunk(request_id=rid, data=responses.delta(b" world")))
    await asyncio.sleep(0.02)
    done = ResponseChunk(
        request_id=rid, data=responses.last("length", usage_parameters(3, 2)), done=True,
        prompt_tokens=3, completion_tokens=2, finish_reason="length",
    )  # fmt: skip
    await send(done)


class EchoTensorWorker:
    """A tensor worker: answers each ``TensorInfer`` with its inputs renamed INPUT→OUTPUT."""

    def __init__(self, nc: Client, subjects: Subjects, worker_id: str = "t1") -> None:
        self._nc = nc
        self._subjects = subjects
        self.worker_id = worker_id
        self.seen: list[TensorInfer] = []

    async def start(self) -> None:
        await self._nc.subscribe(self._subjects.tensor_infer(self.worker_id), cb=self._on)
        await self._nc.flush()

    async def _on(self, msg: Msg) -> None:
        infer = codec.decode(msg.data, TensorInfer)
        self.seen.append(infer)
        outputs = tuple(
            Tensor(
                name=t.name.replace("INPUT", "OUTPUT"),
                datatype=t.datatype,
                shape=t.shape,
                data=t.data,
            )
            for t in infer.inputs
        )
        result = TensorResult(
            request_id=infer.request_id, model=infer.model, outputs=outputs, id=infer.id
        )
        await self._nc.publish(infer.reply_to, codec.encode(result))


TENSOR_SPEC = TensorModelSpec(
    inputs=(
        TensorSpec(name="INPUT0", datatype="INT32", shape=(-1,)),
        TensorSpec(name="INPUT1", datatype="BYTES", shape=(1,), optional=True),
    ),
    outputs=(
        TensorSpec(name="OUTPUT0", datatype="INT32", shape=(-1,)),
        TensorSpec(name="OUTPUT1", datatype="BYTES", shape=(1,)),
    ),
)


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
async def gateway(nats_url: str, subjects: Subjects) -> AsyncIterator[Gateway]:
    """The real gateway app (HTTP + gRPC) under uvicorn on free ports, in this event loop."""
    config = gateway_config(nats_url, subjects, REQUEST_TIMEOUT_S, shutdown_grace_s=1.0)
    async with served_gateway(config, serve_grpc=True) as gateway:
        yield gateway


@pytest.fixture
async def channel(gateway: Gateway) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(gateway.grpc_target) as chan:
        yield chan


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(channel)


@contextlib.asynccontextmanager
async def registered(
    nc: Client, subjects: Subjects, card: ModelCard, worker: WorkerCard, tmp_path: Path
) -> AsyncIterator[None]:
    await publish_model(nc.jetstream(), subjects, card, tmp_path)
    registration = WorkerRegistration(nc.jetstream(), subjects, worker)
    await registration.start()
    try:
        yield
    finally:
        await registration.stop()


@pytest.fixture
async def llm_worker(nc: Client, subjects: Subjects, tmp_path: Path) -> AsyncIterator[None]:
    """``MODEL`` is an LLM with one live worker card."""
    card = ModelCard(model=MODEL, context_length=4096)
    async with registered(nc, subjects, card, WorkerCard(worker_id="w1", model=MODEL), tmp_path):
        yield


@pytest.fixture
async def downstream(nc: Client, subjects: Subjects) -> AsyncIterator[FakeDownstream]:
    fake = FakeDownstream(nc, subjects, hello_world)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def ready(
    gateway: Gateway,
    llm_worker: None,
    downstream: FakeDownstream,
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> FakeDownstream:
    """A gateway that sees a live LLM, with the fake downstream answering."""
    await _until_ready(stub, MODEL)
    return downstream


@pytest.fixture
async def echo_worker(
    nc: Client, subjects: Subjects, tmp_path: Path, stub: pb_grpc.GRPCInferenceServiceStub
) -> AsyncIterator[EchoTensorWorker]:
    """``TENSOR_MODEL``: a tensor model card, a worker card, and the worker answering."""
    card = ModelCard(model=TENSOR_MODEL, context_length=0, kind="tensor", tensor_spec=TENSOR_SPEC)
    worker = EchoTensorWorker(nc, subjects)
    await worker.start()
    worker_card = WorkerCard(worker_id=worker.worker_id, model=TENSOR_MODEL, kind="tensor")
    async with registered(nc, subjects, card, worker_card, tmp_path):
        await _until_ready(stub, TENSOR_MODEL)
        yield worker


@pytest.fixture
async def cancels(nc: Client, subjects: Subjects) -> asyncio.Queue[Cancel]:
    """Every ``Cancel`` broadcast in this namespace."""
    queue: asyncio.Queue[Cancel] = asyncio.Queue()

    async def on_cancel(msg: Msg) -> None:
        queue.put_nowait(codec.decode(msg.data, Cancel))

    await nc.subscribe(subjects.cancel, cb=on_cancel)
    await nc.flush()
    return queue


async def _until_ready(stub: pb_grpc.GRPCInferenceServiceStub, model: str) -> None:
    async def ready() -> bool:
        return bool((await stub.ModelReady(pb.ModelReadyRequest(name=model))).ready)

    await eventually_awaited(ready, timeout_s=WAIT_S, message=f"{model} never became ready")


async def _stream(
    stub: pb_grpc.GRPCInferenceServiceStub, requests: list[pb.ModelInferRequest]
) -> list[pb.ModelStreamInferResponse]:
    """Write every request, half-close, and read until the server ends the stream."""
    call = stub.ModelStreamInfer(timeout=WAIT_S * 2)
    for request in requests:
        await call.write(request)
    await call.done_writing()
    return [response async for response in call]


# --- server and model metadata -------------------------------------------------------------------


async def test_live_but_not_ready_without_a_live_model(
    gateway: Gateway, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    live = await stub.ServerLive(pb.ServerLiveRequest())
    ready = await stub.ServerReady(pb.ServerReadyRequest())
    model = await stub.ModelReady(pb.ModelReadyRequest(name=MODEL))
    assert (live.live, ready.ready, model.ready) == (True, False, False)


async def test_ready_once_a_model_has_a_live_worker(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    server = await stub.ServerReady(pb.ServerReadyRequest())
    model = await stub.ModelReady(pb.ModelReadyRequest(name=MODEL, version="1"))
    other_version = await stub.ModelReady(pb.ModelReadyRequest(name=MODEL, version="2"))
    assert (server.ready, model.ready, other_version.ready) == (True, True, False)


async def test_server_metadata_names_jetserve(
    gateway: Gateway, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    metadata = await stub.ServerMetadata(pb.ServerMetadataRequest())
    assert metadata.name == "jetserve"
    assert metadata.version
    assert "model_configuration" in metadata.extensions


async def test_llm_metadata_and_config_describe_text_in_and_out(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    metadata = await stub.ModelMetadata(pb.ModelMetadataRequest(name=MODEL))
    config = (await stub.ModelConfig(pb.ModelConfigRequest(name=MODEL))).config
    assert (metadata.name, list(metadata.versions), metadata.platform) == (MODEL, ["1"], "jetserve")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("text_input", "BYTES", [1]),
        ("streaming", "BOOL", [1]),
    ]
    assert [(t.name, t.datatype) for t in metadata.outputs] == [
        ("text_output", "BYTES"),
        ("finish_reason", "BYTES"),
    ]
    assert (config.name, config.backend, config.max_batch_size) == (MODEL, "jetserve", 0)
    assert [(i.name, i.data_type, i.optional) for i in config.input] == [
        ("text_input", mc.TYPE_STRING, False),
        ("streaming", mc.TYPE_BOOL, True),
    ]


async def test_unknown_model_is_not_found(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as metadata:
        await stub.ModelMetadata(pb.ModelMetadataRequest(name="no-such-model"))
    with pytest.raises(grpc.aio.AioRpcError) as infer:
        await stub.ModelInfer(text_request(model="no-such-model"))
    assert metadata.value.code() == infer.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no-such-model" in (infer.value.details() or "")


async def test_health_is_serving_only_once_a_model_is_live(
    gateway: Gateway,
    channel: grpc.aio.Channel,
    llm_worker: None,
) -> None:
    health = health_pb2_grpc.HealthStub(channel)

    async def serving(service: str) -> bool:
        answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    for service in ("", SERVICE):  # the server's overall health, then the KServe service's
        await eventually_awaited(
            lambda service=service: serving(service),
            timeout_s=WAIT_S,
            interval_s=0.05,
            message=f"the health of {service!r} is never SERVING",
        )


async def test_health_is_not_serving_without_a_live_model(
    gateway: Gateway, channel: grpc.aio.Channel
) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
    assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_reflection_lists_the_services(gateway: Gateway, channel: grpc.aio.Channel) -> None:
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = reflect.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    answers = [answer async for answer in call]
    names = {s.name for s in answers[0].list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= names


# --- LLM inference -------------------------------------------------------------------------------


async def test_model_infer_returns_the_whole_text_and_finish_reason(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub, subjects: Subjects
) -> None:
    call = stub.ModelInfer(
        text_request(request_id="req-7", max_tokens=5, temperature=0.5),
        metadata=(("x-request-id", "abc-1"),),
    )
    response = await call
    request = await ready.next_request()
    assert outputs_of(response) == {"text_output": b"Hello world", "finish_reason": b"stop"}
    assert (response.model_name, response.model_version, response.id) == (MODEL, "1", "req-7")
    assert (request.request_id, request.api, request.prompt) == ("abc-1", "completion", "Say hello")
    assert request.reply_to == subjects.reply("gw1", "abc-1")
    assert (request.output.format, request.output.stream) == ("text", False)
    assert (request.sampling.max_tokens, request.sampling.temperature) == (5, 0.5)
    assert ("x-request-id", "abc-1") in tuple(await call.trailing_metadata() or ())


async def test_typed_contents_are_read_like_raw_ones(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    response = await stub.ModelInfer(text_request("Typed hello", typed=True, streaming=False))
    request = await ready.next_request()
    assert outputs_of(response)["text_output"] == b"Hello world"
    assert request.prompt == "Typed hello"


async def test_sampling_knobs_as_input_tensors(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    request = text_request()
    request.inputs.add(name="max_tokens", datatype="INT32", shape=[1])
    request.raw_input_contents.append(struct.pack("<i", 9))
    request.inputs.add(name="stop", datatype="BYTES", shape=[2])
    request.raw_input_contents.append(bytes_raw(b"END", b"\n\n"))
    await stub.ModelInfer(request)
    seen = await ready.next_request()
    assert (seen.sampling.max_tokens, seen.output.stop) == (9, ("END", "\n\n"))


async def test_streaming_on_model_infer_is_invalid_argument(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ModelInfer(text_request(streaming=True))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ModelStreamInfer" in (caught.value.details() or "")


async def test_missing_text_input_is_invalid_argument(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    request = pb.ModelInferRequest(model_name=MODEL)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "text_input" in (caught.value.details() or "")


async def test_wrong_datatype_is_invalid_argument(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="text_input", datatype="INT32", shape=[1])
    request.raw_input_contents.append(struct.pack("<i", 1))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_out_of_range_sampling_value_is_invalid_argument(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ModelInfer(text_request(temperature=3.0))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "temperature" in (caught.value.details() or "")


async def test_no_preprocessor_running_is_unavailable(
    gateway: Gateway, llm_worker: None, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    await _until_ready(stub, MODEL)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ModelInfer(text_request())
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ("retry-after", "1") in tuple(caught.value.trailing_metadata() or ())


async def test_client_deadline_is_deadline_exceeded_and_cancels(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub, cancels: asyncio.Queue[Cancel]
) -> None:
    async def silent(request: Preprocess, send: Send) -> None:
        return None

    ready.script = silent
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ModelInfer(text_request(), timeout=0.3)
    request = await ready.next_request()
    cancel = await asyncio.wait_for(cancels.get(), HANG_S)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert (cancel.request_id, cancel.reason) == (request.request_id, "timeout")
    assert request.deadline_ms <= (time.time() + 0.3) * 1000
    # The gateway waits out the client's 0.3 s, not its own 2 s: both stamps are taken at one
    # moment, ``created`` in whole seconds, so the gap is under 1.3 s with the client's deadline
    # and at least 2 s with the gateway's own timeout, however busy the machine.
    assert request.deadline_ms - request.created * 1000 < REQUEST_TIMEOUT_S * 1000


async def test_one_access_line_per_request_and_grpc_metrics(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub, gateway: Gateway
) -> None:
    with capture_logs(processors=[merge_contextvars]) as logs:
        await stub.ModelInfer(text_request())
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.ModelInfer(text_request(model="no-such-model"))
    lines = [line for line in logs if line["event"] == "request_finished"]
    assert [(line["rpc"], line["status"], line["log_level"]) for line in lines] == [
        ("ModelInfer", "OK", "info"),
        ("ModelInfer", "NOT_FOUND", "info"),
    ]
    assert (lines[0]["prompt_tokens"], lines[0]["completion_tokens"]) == (3, 2)
    assert lines[0]["method"] == "grpc"
    assert 0 < lines[0]["ttft_ms"] <= lines[0]["duration_ms"]
    assert lines[1]["error"] == "model_not_found"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.config.http_port}") as http:
        text = (await http.get("/metrics")).text
    assert 'jetserve_grpc_requests_total{code="OK",rpc="ModelInfer"} 1.0' in text
    assert 'jetserve_grpc_requests_total{code="NOT_FOUND",rpc="ModelInfer"} 1.0' in text
    assert 'jetserve_grpc_request_seconds_count{rpc="ModelInfer"} 2.0' in text


# --- LLM streams ---------------------------------------------------------------------------------


async def test_stream_answers_concurrent_requests_tagged_by_id(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    async def held_then_hello(request: Preprocess, send: Send) -> None:
        if request.prompt == "first":
            await ready.release.wait()  # answered after the others: they run concurrently
        await hello_world(request, send)
        if request.prompt == "third":
            ready.release.set()

    ready.script = held_then_hello
    requests = [text_request(p, request_id=p) for p in ("first", "second", "third")]
    responses = await _stream(stub, requests)
    by_id: dict[str, list[pb.ModelInferResponse]] = {}
    for response in responses:
        assert not response.error_message
        by_id.setdefault(response.infer_response.id, []).append(response.infer_response)
    assert set(by_id) == {"first", "second", "third"}
    for answers in by_id.values():
        texts = [outputs_of(a).get("text_output", b"") for a in answers]
        assert b"".join(texts) == b"Hello world"
        assert outputs_of(answers[-1])["finish_reason"] == b"length"
        assert answers[-1].parameters["triton_final_response"].bool_param
        assert all("finish_reason" not in outputs_of(a) for a in answers[:-1])
    assert responses[-1].infer_response.id == "first"
    seen = [await ready.next_request() for _ in range(3)]
    assert all(s.output.stream and s.output.format == "kserve" for s in seen)
    counts = answers[-1].parameters
    assert (counts["prompt_tokens"].int64_param, counts["completion_tokens"].int64_param) == (3, 2)


async def test_stream_request_not_streaming_gets_one_response(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    responses = await _stream(stub, [text_request(request_id="r1", streaming=False)])
    assert len(responses) == 1
    assert outputs_of(responses[0].infer_response) == {
        "text_output": b"Hello world",
        "finish_reason": b"stop",
    }


async def test_a_failed_request_is_an_error_on_the_stream_which_goes_on(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    async def fail_one(request: Preprocess, send: Send) -> None:
        if request.prompt == "bad":
            failed = RequestFailed(
                request_id=request.request_id, code="context_length_exceeded",
                message="too long", status=400,
            )  # fmt: skip
            await send(failed)
            return
        await hello_world(request, send)

    ready.script = fail_one
    requests = [
        text_request("bad", request_id="a"),
        text_request(request_id="b", model="no-such-model"),
        text_request("good", request_id="c"),
    ]
    responses = await _stream(stub, requests)
    errors = {r.infer_response.id: r.error_message for r in responses if r.error_message}
    good = [r.infer_response for r in responses if r.infer_response.id == "c"]
    assert errors["a"] == "too long"
    assert "no-such-model" in errors["b"]
    assert outputs_of(good[-1])["finish_reason"] == b"length"


async def test_cancelling_a_stream_cancels_its_requests_upstream(
    ready: FakeDownstream, stub: pb_grpc.GRPCInferenceServiceStub, cancels: asyncio.Queue[Cancel]
) -> None:
    async def first_then_hold(request: Preprocess, send: Send) -> None:
        data = framing(request).delta(b"Hel")
        await send(ResponseChunk(request_id=request.request_id, data=data))
        await ready.release.wait()

    ready.script = first_then_hold
    call = stub.ModelStreamInfer()
    await call.write(text_request(request_id="r1"))
    first = await asyncio.wait_for(call.read(), WAIT_S)
    request = await ready.next_request()
    call.cancel()
    cancel = await asyncio.wait_for(cancels.get(), WAIT_S)
    assert outputs_of(first.infer_response) == {"text_output": b"Hel"}
    assert (cancel.request_id, cancel.reason) == (request.request_id, "client_disconnected")


# --- tensor models -------------------------------------------------------------------------------


async def test_tensor_model_metadata_and_config_come_from_its_spec(
    echo_worker: EchoTensorWorker, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    metadata = await stub.ModelMetadata(pb.ModelMetadataRequest(name=TENSOR_MODEL))
    config = (await stub.ModelConfig(pb.ModelConfigRequest(name=TENSOR_MODEL))).config
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "INT32", [-1]),
        ("INPUT1", "BYTES", [1]),
    ]
    assert [(i.name, i.data_type, list(i.dims), i.optional) for i in config.input] == [
        ("INPUT0", mc.TYPE_INT32, [-1], False),
        ("INPUT1", mc.TYPE_STRING, [1], True),
    ]


async def test_tensor_model_config_is_the_triton_config_verbatim(
    gateway: Gateway,
    nc: Client,
    subjects: Subjects,
    tmp_path: Path,
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    triton = mc.ModelConfig(name="triton-model", backend="python", max_batch_size=8)
    triton.input.add(name="IN", data_type=mc.TYPE_FP32, dims=[4])
    triton.output.add(name="OUT", data_type=mc.TYPE_FP32, dims=[4])
    triton.parameters["custom"].string_value = "kept"
    spec = TensorModelSpec(inputs=(), outputs=(), triton_model_config=triton.SerializeToString())
    card = ModelCard(model="triton-model", context_length=0, kind="tensor", tensor_spec=spec)
    worker = WorkerCard(worker_id="t9", model="triton-model", kind="tensor")
    async with registered(nc, subjects, card, worker, tmp_path):
        config = (await stub.ModelConfig(pb.ModelConfigRequest(name="triton-model"))).config
        metadata = await stub.ModelMetadata(pb.ModelMetadataRequest(name="triton-model"))
    assert config == triton
    assert [(t.name, list(t.shape)) for t in metadata.inputs] == [("IN", [-1, 4])]


async def test_tensor_infer_round_trips_raw_and_typed_contents(
    echo_worker: EchoTensorWorker, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    request = pb.ModelInferRequest(model_name=TENSOR_MODEL, id="t-1")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[3]).contents.int_contents.extend(
        [1, -2, 3]
    )
    request.inputs.add(name="INPUT1", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        b"abc"
    )
    response = await stub.ModelInfer(request)
    infer = echo_worker.seen[-1]
    assert [(t.name, t.datatype, list(t.shape)) for t in response.outputs] == [
        ("OUTPUT0", "INT32", [3]),
        ("OUTPUT1", "BYTES", [1]),
    ]
    assert struct.unpack("<3i", response.raw_output_contents[0]) == (1, -2, 3)
    assert response.raw_output_contents[1] == bytes_raw(b"abc")
    assert (response.id, response.model_name) == ("t-1", TENSOR_MODEL)
    assert infer.inputs[0].data == struct.pack("<3i", 1, -2, 3)


async def test_tensor_shape_or_datatype_mismatch_is_invalid_argument(
    echo_worker: EchoTensorWorker, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    wrong_shape = pb.ModelInferRequest(model_name=TENSOR_MODEL)
    wrong_shape.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 2])
    wrong_shape.raw_input_contents.append(struct.pack("<2i", 1, 2))
    short = pb.ModelInferRequest(model_name=TENSOR_MODEL)
    short.inputs.add(name="INPUT0", datatype="INT32", shape=[2])
    short.raw_input_contents.append(struct.pack("<i", 1))
    codes = []
    for request in (wrong_shape, short):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ModelInfer(request)
        codes.append(caught.value.code())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 2
    assert echo_worker.seen == []


async def test_tensor_requests_on_a_stream_get_one_response_each(
    echo_worker: EchoTensorWorker, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    requests = []
    for n in range(3):
        request = pb.ModelInferRequest(model_name=TENSOR_MODEL, id=f"s{n}")
        request.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
        request.raw_input_contents.append(struct.pack("<i", n))
        requests.append(request)
    responses = await _stream(stub, requests)
    got = {r.infer_response.id: r.infer_response.raw_output_contents[0] for r in responses}
    assert got == {f"s{n}": struct.pack("<i", n) for n in range(3)}


async def test_tensor_worker_gone_is_unavailable(
    gateway: Gateway,
    nc: Client,
    subjects: Subjects,
    tmp_path: Path,
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    card = ModelCard(model=TENSOR_MODEL, context_length=0, kind="tensor", tensor_spec=TENSOR_SPEC)
    worker = WorkerCard(worker_id="ghost", model=TENSOR_MODEL, kind="tensor")
    request = pb.ModelInferRequest(model_name=TENSOR_MODEL)
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    request.raw_input_contents.append(struct.pack("<i", 1))
    async with registered(nc, subjects, card, worker, tmp_path):
        await _until_ready(stub, TENSOR_MODEL)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "ghost" in (caught.value.details() or "")


# --- the real process --------------------------------------------------------------------------


async def test_sigterm_lets_an_open_stream_finish_then_exits(
    nats_url: str,
    subjects: Subjects,
    llm_worker: None,
    downstream: FakeDownstream,
    tmp_path: Path,
) -> None:
    async def first_then_rest_on_release(request: Preprocess, send: Send) -> None:
        rid, responses = request.request_id, framing(request)
        await send(ResponseChunk(request_id=rid, data=responses.delta(b"Hel")))
        await downstream.release.wait()
        rest = responses.delta(b"lo") + responses.last("stop", {})
        await send(ResponseChunk(request_id=rid, data=rest, done=True, finish_reason="stop"))

    downstream.script = first_then_rest_on_release
    grpc_port = free_port()
    log_path = tmp_path / "gateway.log"
    env = {
        "JETSERVE_NATS_URL": nats_url,
        "JETSERVE_NAMESPACE": subjects.namespace,
        "JETSERVE_LOG_FORMAT": "json",
        "JETSERVE_GATEWAY_GRPC_PORT": str(grpc_port),
        "JETSERVE_GATEWAY_SHUTDOWN_GRACE_S": "5",
    }
    proc = _spawn_gateway(env, log_path)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as chan:
            stub = pb_grpc.GRPCInferenceServiceStub(chan)
            await _until_serving(stub, proc, log_path)
            call = stub.ModelStreamInfer(timeout=WAIT_S * 2)
            await call.write(text_request(request_id="r1"))
            first = await asyncio.wait_for(call.read(), WAIT_S)
            proc.send_signal(signal.SIGTERM)
            await until(lambda: "shutdown_started" in _text(log_path), "SIGTERM")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ModelInfer(text_request(), timeout=WAIT_S)
            downstream.release.set()
            await call.done_writing()
            rest = []
            while (response := await call.read()) is not grpc.aio.EOF:
                rest.append(response)
        code = await asyncio.wait_for(asyncio.to_thread(proc.wait), WAIT_S * 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = _text(log_path)
    assert outputs_of(first.infer_response) == {"text_output": b"Hel"}
    assert [outputs_of(r.infer_response) for r in rest] == [
        {"text_output": b"lo"},
        {"finish_reason": b"stop"},
    ]
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert code in (0, -signal.SIGTERM), log
    assert "grpc_stopped" in log
    assert "bus_stopped" in log


async def _until_serving(
    stub: pb_grpc.GRPCInferenceServiceStub, proc: subprocess.Popen[bytes], log_path: Path
) -> None:
    async def ready() -> bool:
        assert proc.poll() is None, _text(log_path)
        with contextlib.suppress(grpc.aio.AioRpcError):
            return bool((await stub.ModelReady(pb.ModelReadyRequest(name=MODEL), timeout=1)).ready)
        return False

    await eventually_awaited(
        ready,
        timeout_s=WAIT_S * 2,
        interval_s=0.05,
        message=lambda: f"gateway not ready: {_text(log_path)}",
    )


def _spawn_gateway(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m services.gateway`` in its own session, logging to ``log_path``."""
    with log_path.open("wb") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "services.gateway", "--http-port", str(free_port())],
            env={**os.environ, **env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _text(path: Path) -> str:
    return path.read_text()


# --- the real pipeline ---------------------------------------------------------------------------


async def test_real_pipeline_answers_model_infer_and_a_stream(
    nats_url: str,
    subjects: Subjects,
    model_info: ModelInfo,
    gateway: Gateway,
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    """Preprocessor, router, formatter and a mocker in-process; no fakes."""
    async with _pipeline(nats_url, subjects, model_info) as model:
        await _until_ready(stub, model)
        unary = await _warm(stub, text_request("Say hello", model=model, max_tokens=6))
        streamed = await _stream(
            stub,
            [
                text_request("Say hello", request_id=f"s{n}", model=model, max_tokens=6)
                for n in range(2)
            ],
        )
    text = outputs_of(unary)
    assert text["text_output"]
    assert text["finish_reason"] in (b"length", b"stop")
    for n in range(2):
        answers = [r.infer_response for r in streamed if r.infer_response.id == f"s{n}"]
        assert not any(r.error_message for r in streamed)
        assert b"".join(outputs_of(a).get("text_output", b"") for a in answers)
        assert outputs_of(answers[-1])["finish_reason"] in (b"length", b"stop")


async def _warm(
    stub: pb_grpc.GRPCInferenceServiceStub, request: pb.ModelInferRequest
) -> pb.ModelInferResponse:
    """The first request loads tokenizers in the preprocessor and formatter: on a busy machine
    that can outlast the gateway's 2 s request timeout, so retry it for a while."""
    deadline = time.monotonic() + 30
    while True:
        try:
            response: pb.ModelInferResponse = await stub.ModelInfer(request)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() > deadline:
                raise
            continue
        return response


@contextlib.asynccontextmanager
async def _pipeline(nats_url: str, subjects: Subjects, model_info: ModelInfo) -> AsyncIterator[str]:
    """Every service of the LLM path, started in this loop; yields the served model's name."""
    ns = subjects.namespace
    async with contextlib.AsyncExitStack() as stack:
        mocker = await stack.enter_async_context(
            mocker_support.running_mocker(nats_url, subjects, model_info)
        )
        await stack.enter_async_context(
            serving(PreprocessorConfig(nats_url=nats_url, namespace=ns))
        )
        formatter_nc = await nats.connect(nats_url)
        stack.push_async_callback(formatter_nc.drain)
        formatter = build_service(FormatterConfig(nats_url=nats_url, namespace=ns), formatter_nc)
        await formatter.start()
        stack.push_async_callback(formatter.stop)
        router_nc = await connect(nats_url, name="test-router")
        stack.push_async_callback(router_nc.drain)
        router = Router(RouterConfig(nats_url=nats_url, namespace=ns), router_nc)
        await router.start()
        stack.push_async_callback(router.stop)
        yield mocker.config.model_name
