"""One KServe inference over a fake bus: text joining and deltas, cancels, deadlines, tensors."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest

from services.gateway.apis.kserve import join_bytes
from services.gateway.core.context import RequestContext
from services.gateway.core.errors import NoResponders
from services.gateway.core.exchange import Exchanges
from services.gateway.core.readiness import Readiness
from services.gateway.grpc.http2.connection import StreamReset
from services.gateway.grpc.infer import Inference
from shared.errors import InternalError, InvalidRequest, ShuttingDown, UpstreamTimeout
from shared.kserve import grpc_service_pb2 as pb
from shared.messages import (
    ModelCard,
    ResponseChunk,
    Tensor,
    TensorModelSpec,
    TensorResult,
    TensorSpec,
)
from tests.unit.gateway.fakes import FakeBus

Response = pb.ModelInferResponse
HANG_S = 30.0
"""A wait only a hang runs into."""


class Writer:
    """What ``Inference.stream`` writes: framed bytes as they came, and whole messages."""

    def __init__(self) -> None:
        self.framed: list[bytes] = []
        self.messages: list[pb.ModelStreamInferResponse] = []
        self.written = asyncio.Event()

    async def write(self, message: pb.ModelStreamInferResponse) -> None:
        self.messages.append(message)
        self.written.set()

    async def write_framed(self, data: bytes) -> None:
        self.framed.append(data)
        self.written.set()


def chunk(data: bytes, *, done: bool = False, finish: str | None = None) -> ResponseChunk:
    return ResponseChunk(
        request_id="r1",
        data=data,
        done=done,
        prompt_tokens=3 if done else 0,
        completion_tokens=2 if done else 0,
        finish_reason=finish,
    )


def text(response: Response) -> dict[str, bytes]:
    return {
        o.name: raw[4:]
        for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }


def llm(prompt: bytes = b"Hi", *, streaming: bool | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id="c1")
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(join_bytes([prompt]))
    if streaming is not None:
        request.inputs.add(name="streaming", datatype="BOOL", shape=[1])
        request.raw_input_contents.append(bytes([streaming]))
    return request


def inference(
    bus: FakeBus, readiness: Readiness | None = None, *, timeout_s: float = 0.5
) -> Inference:
    exchanges = Exchanges(
        bus, first_timeout_s=timeout_s, idle_timeout_s=timeout_s, client_gone=(StreamReset,)
    )
    return Inference(exchanges, readiness or Readiness())


def context() -> RequestContext:
    return RequestContext("r1", "grpc", "ModelInfer")


async def test_model_infer_joins_the_chunks_and_counts_tokens() -> None:
    bus = FakeBus()
    bus.script = [chunk(b"Hel"), chunk(b"lo"), chunk(b"", done=True, finish="stop")]
    ctx = context()
    response = await inference(bus).run(llm(), ctx)
    assert text(response) == {"text_output": b"Hello", "finish_reason": b"stop"}
    counts = {k: v.int64_param for k, v in response.parameters.items()}
    assert counts == {"prompt_tokens": 3, "completion_tokens": 2}
    assert (ctx.prompt_tokens, ctx.completion_tokens, ctx.model) == (3, 2, "m")
    submitted = bus.submitted[0]
    assert (submitted.output.format, submitted.output.stream, submitted.prompt) == (
        "text",
        False,
        "Hi",
    )


async def test_streaming_on_model_infer_is_invalid() -> None:
    with pytest.raises(InvalidRequest, match="ModelStreamInfer"):
        await inference(FakeBus()).run(llm(streaming=True), context())


async def test_a_stream_relays_the_formatters_bytes_and_queued_ones_together() -> None:
    """``kserve`` format: the gateway writes what the formatter framed, without parsing it."""
    bus = FakeBus()
    bus.script = [chunk(b"<He>")]
    writer = Writer()
    ctx = context()
    task = asyncio.create_task(inference(bus).stream(llm(), ctx, writer))
    await asyncio.wait_for(writer.written.wait(), 1)
    inbox = bus.inboxes[0]
    for item in (chunk(b"<l>"), chunk(b"<lo>"), chunk(b"<end>", done=True, finish="length")):
        inbox.put_nowait(item)
    await task
    assert (writer.framed, writer.messages) == ([b"<He>", b"<l><lo><end>"], [])
    assert (ctx.prompt_tokens, ctx.completion_tokens) == (3, 2)
    output = bus.submitted[0].output
    assert (output.format, output.stream) == ("kserve", True)
    assert output.kserve is not None
    assert (output.kserve.id, output.kserve.outputs) == ("c1", ())


async def test_a_stream_request_with_streaming_off_gets_one_final_response() -> None:
    bus = FakeBus()
    bus.script = [chunk(b"Hello", done=True, finish="stop")]
    writer = Writer()
    await inference(bus).stream(llm(streaming=False), context(), writer)
    [message] = writer.messages
    assert (writer.framed, text(message.infer_response)["text_output"]) == ([], b"Hello")
    assert message.infer_response.parameters["triton_final_response"].bool_param
    assert bus.submitted[0].output.format == "text"
    assert not bus.submitted[0].output.stream


async def test_a_cancelled_call_cancels_upstream() -> None:
    bus = FakeBus()
    task = asyncio.create_task(inference(bus).stream(llm(), context(), Writer()))
    await asyncio.sleep(0)  # runs until it waits for the first reply
    assert bus.submitted
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert bus.cancelled == [("r1", "client_disconnected")]


async def test_the_client_deadline_bounds_the_wait_and_cancels_as_timeout() -> None:
    bus = FakeBus()
    # The gateway's own timeouts are an hour: only the client's deadline can end this wait.
    served = inference(bus, timeout_s=3600.0)
    deadline = time.monotonic() + 0.05
    with pytest.raises(UpstreamTimeout):
        await asyncio.wait_for(served.run(llm(), context(), deadline=deadline), HANG_S)
    assert bus.cancelled == [("r1", "timeout")]
    assert bus.submitted[0].deadline_ms <= (time.time() + 0.05) * 1000


async def test_shutting_down_refuses_new_requests() -> None:
    readiness = Readiness()
    readiness.begin_shutdown()
    with pytest.raises(ShuttingDown):
        await inference(FakeBus(), readiness).run(llm(), context())


# --- tensor models -------------------------------------------------------------------------------

SPEC = TensorModelSpec(
    inputs=(TensorSpec(name="IN", datatype="INT32", shape=(-1,)),),
    outputs=(TensorSpec(name="OUT", datatype="INT32", shape=(-1,)),),
)


def tensor_bus() -> FakeBus:
    bus = FakeBus()
    bus.cards["t"] = ModelCard(model="t", context_length=0, kind="tensor", tensor_spec=SPEC)
    bus.workers = ["w1", "w2"]
    return bus


def tensor_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="t", id="c9")
    request.inputs.add(name="IN", datatype="INT32", shape=[2]).contents.int_contents.extend([4, 5])
    return request


def result() -> TensorResult:
    out = Tensor(name="OUT", datatype="INT32", shape=(2,), data=struct.pack("<2i", 4, 5))
    return TensorResult(request_id="r1", model="t", outputs=(out,), id="c9")


async def test_a_tensor_request_goes_to_the_first_worker_in_turn() -> None:
    bus = tensor_bus()
    bus.script = [result()]
    response = await inference(bus).run(tensor_request(), context())
    infer, worker_id = bus.tensor_sent[0]
    assert worker_id == "w1"
    assert (infer.model, infer.id, infer.inputs[0].data) == ("t", "c9", struct.pack("<2i", 4, 5))
    assert infer.reply_to == "gw.r1"
    assert list(response.raw_output_contents) == [struct.pack("<2i", 4, 5)]
    assert (response.id, response.outputs[0].name) == ("c9", "OUT")


async def test_a_badly_sized_worker_output_is_internal_naming_it() -> None:
    bus = tensor_bus()
    short = Tensor(name="OUT", datatype="INT32", shape=(2,), data=struct.pack("<i", 4))
    bus.script = [TensorResult(request_id="r1", model="t", outputs=(short,), id="c9")]
    with pytest.raises(InternalError, match=r"`OUT` \(INT32, shape \[2\]\) has 4 bytes"):
        await inference(bus).run(tensor_request(), context())


async def test_a_model_republished_with_another_spec_gets_a_new_view() -> None:
    bus = tensor_bus()
    served = inference(bus)
    first = await served.view("t")
    assert await served.view("t") is first  # the same card: the same view
    spec = TensorModelSpec(
        inputs=(TensorSpec(name="IMAGE", datatype="FP32", shape=(2,)),), outputs=SPEC.outputs
    )
    bus.cards["t"] = ModelCard(model="t", context_length=0, kind="tensor", tensor_spec=spec)
    view = await served.view("t")
    assert [t.name for t in view.metadata.inputs] == ["IMAGE"]
    assert [i.name for i in view.config.config.input] == ["IMAGE"]
    with pytest.raises(InvalidRequest, match="Unknown input `IN`"):
        await served.run(tensor_request(), context())


async def test_a_worker_that_just_went_is_skipped_for_the_next() -> None:
    bus = tensor_bus()
    bus.tensor_scripts = [[NoResponders("gone")], [result()]]
    await inference(bus).run(tensor_request(), context())
    assert [worker for _, worker in bus.tensor_sent] == ["w1", "w2"]


async def test_no_live_tensor_worker_is_unavailable() -> None:
    bus = tensor_bus()
    bus.workers = []
    with pytest.raises(Exception, match="no live worker") as caught:
        await inference(bus).run(tensor_request(), context())
    assert getattr(caught.value, "code", None) == "no_worker_available"


async def test_a_tensor_request_on_a_stream_is_one_final_response() -> None:
    bus = tensor_bus()
    bus.script = [result()]
    writer = Writer()
    await inference(bus).stream(tensor_request(), context(), writer)
    [message] = writer.messages
    assert list(message.infer_response.raw_output_contents) == [struct.pack("<2i", 4, 5)]
    assert message.infer_response.parameters["triton_final_response"].bool_param
