"""Server-side CPU of the protocol stack itself: grpc.aio (grpc core's threads) against our
loop-native gRPC server against uvicorn's HTTP/1.1, each serving no-op work.

    python -m bench.grpc_server_cost [--rounds 3] [--calls 6400] [--responses 6]
        [--servers own grpcaio http] [--cases unary stream]

Servers, each run in a fresh process of its own (this module with ``--serve MODE --port 0``; it
prints the port it bound), all on uvloop:

- ``grpcaio``: ``grpc.aio.server()``; HTTP/2 and gRPC framing run in C on grpc core's threads.
- ``own``: ``services.gateway.grpc.http2.server.Server`` (``Http2Settings()``, 64 MiB message
  limits); HTTP/2 and gRPC framing run in Python on the event loop.
- ``http``: uvicorn (httptools) with a raw ASGI app.

Both gRPC servers serve one servicer, registered with the generated
``add_GRPCInferenceServiceServicer_to_server``: ``ServerLive`` answers ``live=True``;
``ModelStreamInfer`` answers each request with ``--responses`` small responses from a task of
its own (yielding to the loop before each), through one queue into the response stream, as a
servicer multiplexing requests on a stream does. The HTTP app answers ``POST /infer`` (JSON)
with ``--responses`` SSE chunks and ``[DONE]``, and ``POST /live`` (the unary case) with a
non-streamed JSON reply (``{"live": true}``, Content-Length).

Cases: ``unary`` at c=64, ``stream`` at c=64, and ``stream`` at c=1 with a tenth of the calls. A
stream call is one request and its ``--responses`` responses, read before the next request is
sent. The load is another process (``--drive``): the stock grpc.aio client for the gRPC servers
(c calls or c streams on one channel: one HTTP/2 connection), ``bench.httpclient`` for HTTP
(c kept-alive connections). Every stream or connection is opened and makes a few calls first;
then the server's utime + stime (``/proc/<pid>/stat``, all its threads) is read before the
driven calls and after the last response arrived, so start-up, warm-up and teardown are left
out. One JSON line per run (the servers alternated, their order rotated each round): calls/s
(the client's wall time), the server's CPU per call in ms, and the load average after the run
(client and server share the machine's cores: a high one means the figures are contended).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
import uvicorn
import uvloop

from bench.httpclient import Connection
from bench.serving import cpu_s
from services.gateway.grpc.http2.calls import CallLimits
from services.gateway.grpc.http2.connection import Http2Settings
from services.gateway.grpc.http2.server import Server
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc

SERVERS = ("own", "grpcaio", "http")
CASES = ("unary", "stream")
HOST = "127.0.0.1"
WARM_CALLS = 5
"""Calls on every stream or connection before the measured ones."""
SETTLE_S = 0.1
"""Pause before each CPU reading, so the server finishes what the last call left it."""
TIMEOUT_S = 120.0

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]

# --- the servers (each in its own process: --serve MODE) ----------------------------------------


def _response(request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    raw = [b"\x05\x00\x00\x00hello"]
    infer = pb.ModelInferResponse(
        model_name=request.model_name, id=request.id, raw_output_contents=raw
    )
    return pb.ModelStreamInferResponse(infer_response=infer)


class NoOpServicer(pb_grpc.GRPCInferenceServiceServicer):
    """``ServerLive``: live. ``ModelStreamInfer``: ``responses`` responses to each request."""

    def __init__(self, responses: int) -> None:
        self._responses = responses

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Any
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        queue: asyncio.Queue[pb.ModelStreamInferResponse] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def answer(request: pb.ModelInferRequest) -> None:
            for _ in range(self._responses):
                await asyncio.sleep(0)
                await queue.put(_response(request))

        async def read() -> None:
            async for request in request_iterator:
                task = asyncio.create_task(answer(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        reader = asyncio.create_task(read())
        try:
            while True:
                yield await queue.get()
        finally:
            for task in (reader, *tasks):
                task.cancel()


def _announce(port: int) -> None:
    print(port, flush=True)


async def serve_grpcaio(responses: int, port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(NoOpServicer(responses), server)
    bound = server.add_insecure_port(f"{HOST}:{port}")
    await server.start()
    _announce(bound)
    await server.wait_for_termination()


async def serve_own(responses: int, port: int) -> None:
    server = Server(Http2Settings(), CallLimits(64 << 20, 64 << 20))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(NoOpServicer(responses), server)
    _announce(await server.start(HOST, port))
    await asyncio.Event().wait()


def http_app(responses: int) -> ASGIApp:
    """``/live``: a JSON reply; anything else: ``responses`` SSE chunks and ``[DONE]``."""
    chunk = b'data: {"x": "hello"}\n\n'
    live = b'{"live": true}'

    async def app(
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        json.loads(body)
        if scope["path"] == "/live":
            length = str(len(live)).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", length)]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": live})
            return
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for _ in range(responses):
            await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


async def serve_http(responses: int, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, port))
    sock.listen(2048)  # listening before uvicorn starts: an early client waits in the backlog
    config = uvicorn.Config(
        http_app(responses), http="httptools", lifespan="off", log_level="warning"
    )
    config.access_log = False
    _announce(sock.getsockname()[1])
    await uvicorn.Server(config).serve(sockets=[sock])


SERVE = {"grpcaio": serve_grpcaio, "own": serve_own, "http": serve_http}

# --- the load (its own process: --drive MODE) ---------------------------------------------------


class _Session(Protocol):
    async def call(self) -> None: ...
    async def close(self) -> None: ...


class _GrpcUnary:
    def __init__(self, stub: Any) -> None:
        self._stub = stub

    async def call(self) -> None:
        response = await self._stub.ServerLive(pb.ServerLiveRequest())
        if not response.live:
            raise RuntimeError("ServerLive: not live")

    async def close(self) -> None:
        pass


class _GrpcStream:
    def __init__(self, stub: Any, responses: int) -> None:
        self._call = stub.ModelStreamInfer()
        self._responses = responses
        self._sent = 0

    async def call(self) -> None:
        self._sent += 1
        await self._call.write(pb.ModelInferRequest(model_name="m", id=str(self._sent)))
        for _ in range(self._responses):
            if await self._call.read() is grpc.aio.EOF:
                raise RuntimeError("ModelStreamInfer: the stream ended")

    async def close(self) -> None:
        await self._call.done_writing()
        self._call.cancel()


class _Http:
    def __init__(self, port: int, path: str) -> None:
        self._conn = Connection(HOST, port)
        self._path = path
        self._sent = 0

    async def call(self) -> None:
        self._sent += 1
        record = await self._conn.post_stream(self._path, {"prompt": "hi", "i": self._sent})
        if record.status != 200:
            raise RuntimeError(f"POST {self._path}: status {record.status}")

    async def close(self) -> None:
        await self._conn.close()


async def _calls(session: _Session, n: int) -> None:
    for _ in range(n):
        await session.call()


async def _from_parent() -> str:
    return await asyncio.to_thread(sys.stdin.readline)


async def drive(args: argparse.Namespace) -> None:
    """Warm up, say ``warm``; on a line from the parent run the calls and print their figures;
    on the next line (or EOF) close."""
    channel = None
    sessions: list[_Session]
    if args.drive == "http":
        path = "/live" if args.case == "unary" else "/infer"
        sessions = [_Http(args.port, path) for _ in range(args.concurrency)]
    else:
        channel = grpc.aio.insecure_channel(f"{HOST}:{args.port}")
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        if args.case == "unary":
            sessions = [_GrpcUnary(stub) for _ in range(args.concurrency)]
        else:
            sessions = [_GrpcStream(stub, args.responses) for _ in range(args.concurrency)]
    await asyncio.gather(*(_calls(session, WARM_CALLS) for session in sessions))
    each = args.calls // args.concurrency
    print("warm", flush=True)
    await _from_parent()
    started = time.perf_counter()
    await asyncio.gather(*(_calls(session, each) for session in sessions))
    wall_s = time.perf_counter() - started
    print(json.dumps({"calls": each * len(sessions), "wall_s": wall_s}), flush=True)
    await _from_parent()
    await asyncio.gather(*(session.close() for session in sessions))
    if channel is not None:
        await channel.close()


# --- the runs (this process) --------------------------------------------------------------------


async def _line(proc: asyncio.subprocess.Process, what: str) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), TIMEOUT_S)
    if not line:
        raise RuntimeError(f"pid {proc.pid} exited ({await proc.wait()}) before its {what}")
    return line.decode().strip()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def run_one(
    server: str, case: str, concurrency: int, calls: int, responses: int
) -> dict[str, Any]:
    """One fresh server, one client; the server's CPU over the driven calls only."""
    module = [sys.executable, "-m", "bench.grpc_server_cost"]
    shape = ["--port", "0", "--responses", str(responses)]
    srv = await asyncio.create_subprocess_exec(
        *module, "--serve", server, *shape, stdout=asyncio.subprocess.PIPE
    )
    try:
        port = await _line(srv, "port")
        shape = ["--port", port, "--case", case, "--concurrency", str(concurrency)]
        shape += ["--calls", str(calls), "--responses", str(responses)]
        client = await asyncio.create_subprocess_exec(
            *module,
            "--drive",
            server,
            *shape,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert client.stdin is not None
        try:
            await _line(client, "warm-up")
            await asyncio.sleep(SETTLE_S)
            before = cpu_s(srv.pid)
            client.stdin.write(b"go\n")
            await client.stdin.drain()
            result = json.loads(await _line(client, "result"))
            await asyncio.sleep(SETTLE_S)
            used_s = cpu_s(srv.pid) - before
            client.stdin.close()
            if rc := await asyncio.wait_for(client.wait(), TIMEOUT_S):
                raise RuntimeError(f"the {server} client exited with {rc}")
        finally:
            await _stop(client)
    finally:
        await _stop(srv)
    done = result["calls"]
    return {
        "server": server,
        "case": case,
        "concurrency": concurrency,
        "calls": done,
        "responses": responses if case == "stream" else 1,
        "calls_per_s": round(done / result["wall_s"], 1),
        "server_cpu_ms_per_call": round(used_s * 1000 / done, 4),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


async def measure(args: argparse.Namespace) -> None:
    runs: list[tuple[str, int, int]] = []
    if "unary" in args.cases:
        runs.append(("unary", 64, args.calls))
    if "stream" in args.cases:
        runs += [("stream", 64, args.calls), ("stream", 1, max(1, args.calls // 10))]
    servers = list(args.servers)
    for round_ in range(1, args.rounds + 1):
        shift = (round_ - 1) % len(servers)
        order = servers[shift:] + servers[:shift]
        for case, concurrency, calls in runs:
            for server in order:
                line = await run_one(server, case, concurrency, calls, args.responses)
                print(json.dumps({"round": round_, **line}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_server_cost", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=6400, help="at c=64 (c=1: a tenth)")
    parser.add_argument("--responses", type=int, default=6, help="per stream request")
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--drive", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=CASES, default="unary", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=64, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        uvloop.run(SERVE[args.serve](args.responses, args.port))
    elif args.drive:
        asyncio.run(drive(args))
    else:
        asyncio.run(measure(args))


if __name__ == "__main__":
    main()
