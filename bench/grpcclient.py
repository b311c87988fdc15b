"""KServe v2 / Triton streaming clients for the benchmark: one ``ModelStreamInfer`` stream per
client, its requests one after another on it, like one kept-alive HTTP connection.

``LoopStreamClient`` (grpclib: asyncio, no threads, like the raw HTTP client in
``httpclient.py``) measures the server; ``StreamClient`` is the stock client (``grpc.aio``,
grpc core's threads), what Triton users run. Both read Triton's ``raw_output_contents`` and the
typed ``contents`` Dynamo's KServe frontend answers with.
"""

from __future__ import annotations

import contextlib
import struct
import time
from typing import Any

import grpc
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError

from bench.httpclient import Record
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc

_LENGTH = struct.Struct("<I")
CHANNEL_OPTIONS = [
    # Channels in one process share connections by default; each client gets its own, as HTTP.
    ("grpc.use_local_subchannel_pool", 1),
]
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"

StreamCall = Any
"""``grpc.aio.StreamStreamCall[pb.ModelInferRequest, pb.ModelStreamInferResponse]``."""


def text_request(
    model: str, prompt: str, *, request_id: str, max_tokens: int, ignore_eos: bool = True
) -> pb.ModelInferRequest:
    """An LLM request as the seed describes it: ``text_input`` and ``streaming`` (raw), knobs
    as ``parameters`` (Dynamo's frontend ignores those; it takes ``max_tokens`` from its
    request template)."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    data = prompt.encode()
    request.raw_input_contents.append(_LENGTH.pack(len(data)) + data)
    request.inputs.add(name="streaming", datatype="BOOL", shape=[1])
    request.raw_input_contents.append(b"\x01")
    request.parameters["max_tokens"].int64_param = max_tokens
    request.parameters["ignore_eos"].bool_param = ignore_eos
    request.parameters["temperature"].double_param = 0.0
    return request


def text_outputs(response: pb.ModelInferResponse) -> tuple[bytes, str | None]:
    """``text_output`` (empty when absent) and ``finish_reason`` (``None`` when absent or
    empty: Dynamo sends an empty one with every delta)."""
    text, finish = b"", None
    raw = response.raw_output_contents
    for i, output in enumerate(response.outputs):
        if output.name not in ("text_output", "finish_reason"):
            continue
        if i < len(raw):
            value = _one_element(raw[i])
        else:
            values = output.contents.bytes_contents
            value = values[0] if values else b""
        if output.name == "text_output":
            text = value
        elif value:
            finish = value.decode()
    return text, finish


def _one_element(raw: bytes) -> bytes:
    (length,) = _LENGTH.unpack_from(raw)
    return raw[4 : 4 + length]


class _Client:
    """``infer`` sends a request and reads its responses until the one with a finish reason."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._sent = 0

    async def _send(self, request: pb.ModelInferRequest) -> None:
        raise NotImplementedError

    async def _recv(self) -> pb.ModelStreamInferResponse | None:
        """The next response; ``None`` when the stream ended."""
        raise NotImplementedError

    def _broken(self) -> None:
        """The stream failed: the next request opens a new one."""

    async def close(self) -> None:
        """Half-close the stream, drain it, and close the channel."""
        raise NotImplementedError

    async def infer(self, model: str, prompt: str, max_tokens: int) -> Record:
        """One streamed request (``ignore_eos``); its TTFT, gaps and token counts (from the
        last response's ``parameters``; a server that sends none — Dynamo — gets ``max_tokens``
        for a ``length`` finish)."""
        self._sent += 1
        request = text_request(model, prompt, request_id=str(self._sent), max_tokens=max_tokens)
        rec = Record()
        t0 = time.perf_counter()
        last: float | None = None
        try:
            await self._send(request)
            while True:
                message = await self._recv()
                if message is None:
                    rec.error = "the stream ended early"
                    break
                if message.error_message:
                    rec.error = message.error_message
                    break
                text, finish = text_outputs(message.infer_response)
                if text:
                    last = rec.text_arrived(t0, last)
                if finish is not None:
                    counts = message.infer_response.parameters
                    if "completion_tokens" in counts:
                        rec.completion_tokens = counts["completion_tokens"].int64_param
                        rec.prompt_tokens = counts["prompt_tokens"].int64_param
                    else:  # Dynamo reports none: every benchmark request ignores EOS
                        rec.completion_tokens = max_tokens if finish == "length" else 0
                    break
        except (grpc.RpcError, GRPCError, StreamTerminatedError, OSError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
            self._broken()
        rec.e2e_s = time.perf_counter() - t0
        rec.ok = rec.error is None and rec.ttft_s is not None
        return rec


class StreamClient(_Client):
    """The stock client: one ``grpc.aio`` channel and one bidirectional stream."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._call: StreamCall | None = None

    async def _send(self, request: pb.ModelInferRequest) -> None:
        if self._call is None:
            self._call = self._stub.ModelStreamInfer()
        await self._call.write(request)

    async def _recv(self) -> pb.ModelStreamInferResponse | None:
        assert self._call is not None
        message = await self._call.read()
        return None if message is grpc.aio.EOF else message

    def _broken(self) -> None:
        self._call = None

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


class LoopStreamClient(_Client):
    """A grpclib channel (HTTP/2 on the event loop) and one bidirectional stream."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        host, port = target.rsplit(":", 1)
        self._channel = Channel(host.strip("[]"), int(port))
        self._context: Any = None
        self._stream: Any = None

    async def _send(self, request: pb.ModelInferRequest) -> None:
        if self._stream is None:
            self._context = self._channel.request(
                STREAM_METHOD,
                Cardinality.STREAM_STREAM,
                pb.ModelInferRequest,
                pb.ModelStreamInferResponse,
            )
            self._stream = await self._context.__aenter__()
        await self._stream.send_message(request)

    async def _recv(self) -> pb.ModelStreamInferResponse | None:
        message: pb.ModelStreamInferResponse | None = await self._stream.recv_message()
        return message

    def _broken(self) -> None:
        self._stream = self._context = None

    async def close(self) -> None:
        """Half-close the stream, drain it, and close the channel."""
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(GRPCError, StreamTerminatedError, OSError):
                await stream.end()
                while await stream.recv_message() is not None:
                    pass
                await self._context.__aexit__(None, None, None)
        self._channel.close()


CLIENTS: dict[str, type[_Client]] = {"grpc": LoopStreamClient, "grpc-grpcio": StreamClient}
"""Benchmark protocol name → client class."""
