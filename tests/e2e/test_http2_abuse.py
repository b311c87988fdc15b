"""The gateway's HTTP/2 server under attack (issue 23): one client, no credentials, loopback.

Each test runs one attack from a raw socket (hand-built frames, a bounded number of them) on a
real stack's gateway process, while probes on other connections keep going: a grpcio
``ModelInfer`` of the echo tensor model and ``GET /health`` over HTTP, one after the other.
It asserts outcomes: the attacking connection ends with GOAWAY and the code, or its streams are
answered or refused as they should be, and every probe was answered. Waits are bounded only so
that a hang fails; no test asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import hpack
import httpx
import openai
import pytest

from services.cli.stack import Stack
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc
from tests.e2e.conftest import MODEL, TENSOR_MODEL, serving_models
from tests.integration.http2_support import (
    END_HEADERS,
    END_STREAM,
    Frame,
    Kind,
    RawClient,
    Response,
    frame,
    raw_client,
)
from tests.support import eventually_awaited

pytestmark = pytest.mark.timeout(120)

ENHANCE_YOUR_CALM = 0xB
COMPRESSION_ERROR = 0x9
FRAME_SIZE_ERROR = 0x6
NO_ERROR = 0x0
CANCEL = 0x8
UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = 14, 4, 8
LIMIT = 8
"""--max-concurrent-requests: one connection's share (0.25) is 2."""
MAX_MESSAGE = 1 << 20
GATEWAY_ARGS = [
    *("--max-concurrent-requests", str(LIMIT), "--send-timeout-s", "1"),
    *("--grpc-max-message-size", str(MAX_MESSAGE)),
    *("--grpc-max-connection-buffer-size", str(MAX_MESSAGE)),
    *("--grpc-idle-timeout-s", "2"),
]
PROBE_TIMEOUT_S = 10.0
WAIT_S = 20.0
MODEL_INFER = b"/inference.GRPCInferenceService/ModelInfer"
ECHO_INPUT = struct.pack("<4i", 1, -2, 3, 4)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """One LLM worker, one echo tensor worker, and a gateway with small limits."""
    run_dir = tmp_path_factory.mktemp("abuse")
    with serving_models(
        run_dir,
        model_dir,
        [MODEL, TENSOR_MODEL],
        grpc_port=0,
        workers=1,
        tensor_workers=1,
        service_args={"gateway": GATEWAY_ARGS},
    ) as s:
        yield s


# --- what the attacks send ----------------------------------------------------------------------


def echo_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=TENSOR_MODEL)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "INT32"
    tensor.shape.append(4)
    request.raw_input_contents.append(ECHO_INPUT)
    return request


def echo_message() -> bytes:
    data = echo_request().SerializeToString()
    return struct.pack(">BI", 0, len(data)) + data


def infer_headers(*extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", MODEL_INFER),
        (b":authority", b"127.0.0.1"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *extra,
    ]


def infer_call(encoder: hpack.Encoder, stream_id: int, *extra: tuple[bytes, bytes]) -> bytes:
    """A whole ModelInfer call of the echo model: HEADERS, then its one message."""
    block = encoder.encode(infer_headers(*extra))
    return frame(Kind.HEADERS, END_HEADERS, stream_id, block) + frame(
        Kind.DATA, END_STREAM, stream_id, echo_message()
    )


def open_stream(encoder: hpack.Encoder, stream_id: int) -> bytes:
    """HEADERS of a ModelInfer call whose message never comes."""
    return frame(Kind.HEADERS, END_HEADERS, stream_id, encoder.encode(infer_headers()))


def zero_window() -> bytes:
    """SETTINGS_INITIAL_WINDOW_SIZE = 0: the server may send no DATA on any stream."""
    return frame(Kind.SETTINGS, 0, 0, struct.pack(">HI", 0x4, 0))


async def calm_goaway(client: RawClient) -> Frame:
    """The GOAWAY that ends an attack; then the connection closes."""
    goaway = await client.goaway()
    await client.until_closed()
    return goaway


# --- the probes ---------------------------------------------------------------------------------


@dataclass
class Tally:
    rounds: int = 0


@contextlib.asynccontextmanager
async def probing(stack: Stack) -> AsyncIterator[Tally]:
    """ModelInfer (grpcio) and GET /health on their own connections, over and over, for the
    ``with`` block; each must be answered, correctly, within ``PROBE_TIMEOUT_S``."""
    tally, stop = Tally(), asyncio.Event()

    async def run() -> None:
        async with (
            grpc.aio.insecure_channel(stack.grpc_address) as channel,
            httpx.AsyncClient(base_url=stack.base_url, timeout=PROBE_TIMEOUT_S) as http,
        ):
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            while not stop.is_set() or tally.rounds == 0:
                reply = await stub.ModelInfer(echo_request(), timeout=PROBE_TIMEOUT_S)
                assert reply.raw_output_contents[0] == ECHO_INPUT, reply
                health = await http.get("/health")
                assert health.status_code == 200, health.text
                tally.rounds += 1
                await asyncio.sleep(0.02)

    task = asyncio.create_task(run())
    try:
        yield tally
    finally:
        stop.set()
        await asyncio.wait_for(task, PROBE_TIMEOUT_S * 3)
    assert tally.rounds >= 1


# --- floods: each ends in GOAWAY ENHANCE_YOUR_CALM ----------------------------------------------

FLOOD = 100_000


def _flood(kind: str) -> bytes:
    encoder = hpack.Encoder()
    if kind == "PING":
        return frame(Kind.PING, 0, 0, b"12345678") * FLOOD
    if kind == "SETTINGS":
        return frame(Kind.SETTINGS, 0, 0) * FLOOD
    if kind == "empty DATA":
        return open_stream(encoder, 1) + frame(Kind.DATA, 0, 1) * FLOOD
    if kind == "empty CONTINUATION":
        block = encoder.encode(infer_headers())
        return frame(Kind.HEADERS, 0, 1, block) + frame(Kind.CONTINUATION, 0, 1) * FLOOD
    if kind == "WINDOW_UPDATE":
        return frame(Kind.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) * FLOOD
    if kind == "PRIORITY":
        return frame(Kind.PRIORITY, 0, 3, struct.pack(">IB", 0, 15)) * FLOOD
    if kind == "unknown":
        return frame(0x20, 0, 0, b"x") * FLOOD
    if kind == "Rapid Reset":
        rst = struct.pack(">I", CANCEL)
        return b"".join(
            open_stream(encoder, 2 * i + 1) + frame(Kind.RST_STREAM, 0, 2 * i + 1, rst)
            for i in range(33_000)
        )
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "PING",
        "SETTINGS",
        "empty DATA",
        "empty CONTINUATION",
        "WINDOW_UPDATE",
        "PRIORITY",
        "unknown",
        "Rapid Reset",
    ],
)
async def test_a_flood_ends_in_goaway_enhance_your_calm(stack: Stack, kind: str) -> None:
    attack = _flood(kind)
    async with probing(stack), raw_client(stack.grpc_port) as client:
        client.send_bytes(attack)
        goaway = await calm_goaway(client)
    assert goaway.code == ENHANCE_YOUR_CALM, goaway
    said = "RST_STREAM" if kind == "Rapid Reset" else kind
    assert said.encode() in goaway.payload[8:], goaway.payload  # the debug data says which


# --- SETTINGS -----------------------------------------------------------------------------------


async def test_a_settings_frame_of_thousands_of_window_entries_is_refused(stack: Stack) -> None:
    """2,730 INITIAL_WINDOW_SIZE entries (a 16 KiB frame) over 1,000 open streams."""
    encoder = hpack.Encoder()
    opened = b"".join(open_stream(encoder, 2 * i + 1) for i in range(1000))
    entries = b"".join(struct.pack(">HI", 0x4, i % 2 * 65_535) for i in range(16_380 // 6))
    async with probing(stack), raw_client(stack.grpc_port) as client:
        client.send_bytes(opened + frame(Kind.SETTINGS, 0, 0, entries))
        goaway = await calm_goaway(client)
    assert goaway.code == ENHANCE_YOUR_CALM, goaway


async def test_frames_over_16_kib_are_refused(stack: Stack) -> None:
    """The server advertises 16 KiB frames: a 1 MiB SETTINGS frame (174k entries) is an error."""
    entries = struct.pack(">HI", 0x4, 0) * ((1 << 20) // 6)
    async with probing(stack), raw_client(stack.grpc_port) as client:
        settings = await client.wait_for(lambda f: f.kind == Kind.SETTINGS and not f.flags)
        client.send_bytes(frame(Kind.SETTINGS, 0, 0, entries))
        goaway = await calm_goaway(client)
    assert dict(struct.unpack_from(">HI", settings.payload, i) for i in range(0, 30, 6))[5] == (
        16_384
    )
    assert goaway.code == FRAME_SIZE_ERROR, goaway


# --- header blocks ------------------------------------------------------------------------------


async def test_three_table_size_updates_in_a_block_are_a_compression_error(stack: Stack) -> None:
    block = b"\x20\x20\x20" + hpack.Encoder().encode(infer_headers())
    async with probing(stack), raw_client(stack.grpc_port) as client:
        client.send(Kind.HEADERS, END_HEADERS, 1, block)
        goaway = await calm_goaway(client)
    assert goaway.code == COMPRESSION_ERROR, goaway


async def test_a_megabyte_of_table_size_updates_is_refused(stack: Stack) -> None:
    """1M table size updates before a request, in 16 KiB frames: the block is too large."""
    block = b"\x20" * 1_000_000 + hpack.Encoder().encode(infer_headers())
    pieces = [block[i : i + 16_384] for i in range(0, len(block), 16_384)]
    frames = frame(Kind.HEADERS, END_STREAM, 1, pieces[0]) + b"".join(
        frame(Kind.CONTINUATION, END_HEADERS if i == len(pieces) - 1 else 0, 1, piece)
        for i, piece in enumerate(pieces[1:], 1)
    )
    async with probing(stack), raw_client(stack.grpc_port) as client:
        client.send_bytes(frames)
        goaway = await calm_goaway(client)
    assert goaway.code in (ENHANCE_YOUR_CALM, COMPRESSION_ERROR), goaway


# --- stalled clients and admission --------------------------------------------------------------


async def _responses(client: RawClient, stream_ids: list[int]) -> dict[int, Response]:
    return {sid: await client.response(sid) for sid in stream_ids}


async def test_stalled_clients_hold_only_their_share_and_lose_it_on_the_send_timeout(
    stack: Stack,
) -> None:
    """Three connections with their windows shut send four ModelInfer calls each: two of each
    are admitted (the share of 8) and stall, two are refused; HTTP still answers; the stalled
    ones are reset once the send timeout passes, and every slot comes back."""
    async with contextlib.AsyncExitStack() as stack_of:
        clients = [
            await stack_of.enter_async_context(raw_client(stack.grpc_port)) for _ in range(3)
        ]
        for held, client in enumerate(clients, 1):
            encoder = hpack.Encoder()
            client.send_bytes(zero_window() + b"".join(infer_call(encoder, s) for s in (1, 3)))
            await _until_in_flight(stack, lambda n, held=held: n >= 2 * held)
            client.send_bytes(b"".join(infer_call(encoder, s) for s in (5, 7)))
        for client in clients:
            refused = await _responses(client, [5, 7])
            for response in refused.values():
                assert response.grpc_status == UNAVAILABLE, response
                assert "this connection" in response.grpc[b"grpc-message"].decode().lower()
        async with openai.AsyncOpenAI(
            base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0
        ) as http:
            reply = await http.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert reply.choices[0].message.content
        for client in clients:
            for sid in (1, 3):
                assert (await client.reset(sid)).code == CANCEL
    await _until_in_flight(stack, lambda n: n == 0)


async def test_a_window_update_flood_over_stalled_answers_ends_in_goaway(stack: Stack) -> None:
    """20k WINDOW_UPDATE(+1) on stream 0 while answers wait on shut stream windows."""
    encoder = hpack.Encoder()
    stalled = zero_window() + b"".join(infer_call(encoder, s) for s in (1, 3))
    updates = frame(Kind.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) * 20_000
    async with probing(stack), raw_client(stack.grpc_port) as client:
        client.send_bytes(stalled)
        await _until_in_flight(stack, lambda n: n >= 2)
        client.send_bytes(updates)
        goaway = await calm_goaway(client)
    assert goaway.code == ENHANCE_YOUR_CALM, goaway
    await _until_in_flight(stack, lambda n: n == 0)


async def _until_in_flight(stack: Stack, holds: Callable[[float], bool]) -> None:
    """Poll ``jetserve_gateway_concurrent_requests`` until ``holds(value)``."""
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=PROBE_TIMEOUT_S) as http:

        async def holding() -> bool:
            text = (await http.get("/metrics")).text
            found = re.search(r"^jetserve_gateway_concurrent_requests (\S+)$", text, re.M)
            assert found, "no jetserve_gateway_concurrent_requests in /metrics"
            return holds(float(found.group(1)))

        await eventually_awaited(
            holding,
            timeout_s=WAIT_S,
            interval_s=0.05,
            message="jetserve_gateway_concurrent_requests never reached the expected value",
        )


# --- deadlines ----------------------------------------------------------------------------------


async def test_sub_millisecond_deadlines_are_deadline_exceeded_and_free_their_streams(
    stack: Stack,
) -> None:
    """1,100 calls (more than the 1,024 streams a connection may have open) with grpc-timeout
    ``1n`` or ``500u``: each is answered DEADLINE_EXCEEDED, none is refused."""
    encoder = hpack.Encoder()
    async with probing(stack), raw_client(stack.grpc_port) as client:
        for batch in range(11):
            ids = [2 * (batch * 100 + i) + 1 for i in range(100)]
            client.send_bytes(
                b"".join(
                    infer_call(encoder, sid, (b"grpc-timeout", b"1n" if sid % 4 == 1 else b"500u"))
                    for sid in ids
                )
            )
            answers = await _responses(client, ids)
            assert {r.grpc_status for r in answers.values()} == {DEADLINE_EXCEEDED}
            assert {r.reset for r in answers.values()} <= {None, NO_ERROR}


# --- memory -------------------------------------------------------------------------------------


async def test_unfinished_messages_past_the_connection_buffer_fail_resource_exhausted(
    stack: Stack,
) -> None:
    """Four streams each announce a (1 MiB - 1) message and send 300 KiB of it: the stream that
    takes the connection past 1 MiB held fails RESOURCE_EXHAUSTED; the others stay open."""
    encoder = hpack.Encoder()
    head = struct.pack(">BI", 0, MAX_MESSAGE - 1)
    body = head + bytes(300 << 10)
    out = b""
    for sid in (1, 3, 5, 7):
        out += open_stream(encoder, sid)
        out += b"".join(
            frame(Kind.DATA, 0, sid, body[i : i + 16_384]) for i in range(0, len(body), 16_384)
        )
    async with probing(stack), raw_client(stack.grpc_port) as client:
        client.send_bytes(out)
        failed = await client.response(7)
        await client.ping()
    assert failed.grpc_status == RESOURCE_EXHAUSTED, failed
    ended = {f.stream_id for f in client.frames if f.stream_id and f.flags & END_STREAM}
    assert ended == {7}


# --- idle connections ---------------------------------------------------------------------------


async def test_an_idle_connection_is_sent_goaway_and_closed(stack: Stack) -> None:
    """--grpc-idle-timeout-s 2: a connection that opens no stream is closed, GOAWAY first."""
    async with raw_client(stack.grpc_port) as client:
        async with asyncio.timeout(WAIT_S):
            while not any(f.kind == Kind.GOAWAY for f in client.frames):
                with contextlib.suppress(TimeoutError):
                    await client.goaway()
        await client.until_closed()
    goaway = next(f for f in client.frames if f.kind == Kind.GOAWAY)
    assert goaway.code == NO_ERROR
