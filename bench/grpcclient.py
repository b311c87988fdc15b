"""A minimal KServe v2 / Triton streaming client for the benchmark (``grpc.aio``, our stubs).

One ``StreamClient`` is one channel (its own TCP connection) holding one ``ModelStreamInfer``
stream; its requests go one after another on that stream, like one kept-alive HTTP connection.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import grpc

from bench.httpclient import Record
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc

_LENGTH = struct.Struct("<I")
CHANNEL_OPTIONS = [
    # Channels in one process share connections by default; each client gets its own, as HTTP.
    ("grpc.use_local_subchannel_pool", 1),
]

StreamCall = Any
"""``grpc.aio.StreamStreamCall[pb.ModelInferRequest, pb.ModelStreamInferResponse]``."""


def text_request(
    model: str, prompt: str, *, request_id: str, max_tokens: int, ignore_eos: bool = True
) -> pb.ModelInferRequest:
    """An LLM request as the seed describes it: ``text_input``, knobs as ``parameters``."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    data = prompt.encode()
    request.raw_input_contents.append(_LENGTH.pack(len(data)) + data)
    request.parameters["max_tokens"].int64_param = max_tokens
    request.parameters["ignore_eos"].bool_param = ignore_eos
    request.parameters["temperature"].double_param = 0.0
    return request


def text_outputs(response: pb.ModelInferResponse) -> tuple[bytes, str | None]:
    """``text_output`` (empty when absent) and ``finish_reason`` (``None`` when absent)."""
    text, finish = b"", None
    for output, raw in zip(response.outputs, response.raw_output_contents, strict=False):
        if output.name == "text_output":
            text = _one_element(raw)
        elif output.name == "finish_reason":
            finish = _one_element(raw).decode()
    return text, finish


def _one_element(raw: bytes) -> bytes:
    (length,) = _LENGTH.unpack_from(raw)
    return raw[4 : 4 + length]


class StreamClient:
    """One channel and one bidirectional stream; ``infer`` sends a request and reads its
    responses until the one with ``finish_reason``."""

    def __init__(self, target: str) -> None:
        self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._call: StreamCall | None = None
        self._sent = 0

    async def infer(self, model: str, prompt: str, max_tokens: int) -> Record:
        """One streamed request (``ignore_eos``); its TTFT, gaps and token count.

        The server reports no token counts over KServe, so a ``length`` finish counts as
        ``max_tokens`` tokens (every benchmark request ignores EOS).
        """
        if self._call is None:
            self._call = self._stub.ModelStreamInfer()
        self._sent += 1
        request = text_request(model, prompt, request_id=str(self._sent), max_tokens=max_tokens)
        rec = Record()
        t0 = time.perf_counter()
        last: float | None = None
        try:
            await self._call.write(request)
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:
                    rec.error = "the stream ended early"
                    break
                if message.error_message:
                    rec.error = message.error_message
                    break
                text, finish = text_outputs(message.infer_response)
                if text:
                    now = time.perf_counter()
                    if last is None:
                        rec.ttft_s = now - t0
                    else:
                        rec.gaps_s.append(now - last)
                    last = now
                if finish is not None:
                    rec.completion_tokens = max_tokens if finish == "length" else 0
                    break
        except grpc.RpcError as exc:
            rec.error = f"{exc.code()}: {exc.details()}"  # type: ignore[attr-defined]
            self._call = None  # the stream is gone; the next request opens a new one
        rec.e2e_s = time.perf_counter() - t0
        rec.ok = rec.error is None and rec.ttft_s is not None
        return rec

    async def close(self) -> None:
        """Half-close the stream, drain it, and close the channel."""
        call, self._call = self._call, None
        if call is not None:
            try:
                await call.done_writing()
                while await call.read() is not grpc.aio.EOF:
                    pass
            except grpc.RpcError:
                pass
        await self._channel.close()
