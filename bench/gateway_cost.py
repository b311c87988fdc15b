"""Gateway CPU per request, HTTP against KServe gRPC, with nothing else of the stack running.

    python -m bench.gateway_cost [--rounds 3] [--requests 3000] [--chunks 6] [--gap-ms 2]

A private nats-server, the gateway as users start it (``python -m services.gateway``), and a
stand-in for preprocessor + formatter in its own process that answers every request with
``--chunks`` chunks ``--gap-ms`` apart (SSE frames for HTTP, framed KServe responses for gRPC,
as the formatter sends them). This process is the load: ``/v1/completions`` streaming over
kept-alive connections (``bench.httpclient``), and ``ModelStreamInfer`` over one stream per
client from grpclib (``grpc``) and from the stock grpcio client (``grpc-grpcio``); c=64 and
c=1, the protocols alternated in each round. One JSON line per run: req/s and the gateway's CPU per
request (utime + stime from /proc, all its threads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nats.aio.client import Client
from nats.aio.msg import Msg

from bench.grpcclient import CLIENTS
from bench.httpclient import Record
from bench.serving import cpu_s, prompts, run_completions, run_grpc
from services.cli.stack import free_port, wait_for_port
from shared import codec
from shared.kserve_wire import TextResponses
from shared.messages import KServeOutput, ModelCard, Preprocess, ResponseChunk, WorkerCard
from shared.registry import WorkerRegistration, publish_model_card
from shared.subjects import Subjects
from tests.support import nats_server

MODEL = "bench-model"
NAMESPACE = "bench"
PROTOCOLS = ("http", *CLIENTS)


# --- the stand-in downstream (its own process) ------------------------------------------------


async def downstream(nats_url: str, chunks: int, gap_s: float) -> None:
    """Answer every ``Preprocess`` like the formatter would, until killed."""
    nc = Client()
    await nc.connect(nats_url)
    subjects = Subjects(NAMESPACE)
    tasks: set[asyncio.Task[None]] = set()

    async def answer(request: Preprocess) -> None:
        rid, to, output = request.request_id, request.reply_to, request.output
        delta, last = b'data: {"choices":[{"text":"tok "}]}\n\n', b"data: [DONE]\n\n"
        if output.format == "kserve":  # framed ModelStreamInferResponses, as the formatter's
            kserve = output.kserve or KServeOutput()
            responses = TextResponses(request.model, kserve.id, kserve.outputs)
            delta, last = responses.delta(b"tok "), responses.last("length", {})
        for i in range(chunks):  # numbered as the formatter numbers them (decision 018)
            await nc.publish(to, codec.encode(ResponseChunk(request_id=rid, data=delta, seq=i)))
            if i < chunks - 1:
                await asyncio.sleep(gap_s)
        done = ResponseChunk(
            request_id=rid,
            data=last,
            done=True,
            seq=chunks,
            prompt_tokens=8,
            completion_tokens=chunks,
            finish_reason="length",
        )
        await nc.publish(to, codec.encode(done))

    async def on_request(msg: Msg) -> None:
        task = asyncio.create_task(answer(codec.decode(msg.data, Preprocess)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    await nc.subscribe(subjects.preprocess, queue="preprocessor", cb=on_request)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()


# --- the load -----------------------------------------------------------------------------------


async def run(protocol: str, target: str, concurrency: int, n: int, tokens: int) -> list[Record]:
    """``n`` requests from ``concurrency`` clients, with ``bench.serving``'s runners."""
    texts = prompts(n, 16)
    if protocol == "http":
        records, _ = await run_completions(f"http://{target}", MODEL, texts, concurrency, tokens)
    else:
        records, _ = await run_grpc(target, MODEL, texts, concurrency, tokens, protocol)
    return records


async def measure(
    args: argparse.Namespace, targets: dict[str, str], gateway: subprocess.Popen[bytes]
) -> None:
    """Warm up, then each round: c=64 and c=1, every protocol in turn."""
    for protocol in args.protocols:  # warm up: the first calls build the model's views
        await run(protocol, targets[protocol], 4, 40, args.chunks)
    for round_ in range(1, args.rounds + 1):
        for concurrency in args.concurrency:
            n = args.requests if concurrency > 1 else max(100, args.requests // 10)
            for protocol in args.protocols:
                before, started = cpu_s(gateway.pid), time.perf_counter()
                records = await run(protocol, targets[protocol], concurrency, n, args.chunks)
                wall = time.perf_counter() - started
                used = cpu_s(gateway.pid) - before
                ok = sum(r.ok for r in records)
                line = {
                    "round": round_,
                    "protocol": protocol,
                    "concurrency": concurrency,
                    "requests": n,
                    "errors": n - ok,
                    "req_per_s": round(ok / wall, 1),
                    "gateway_cpu_ms_per_req": round(used * 1000 / max(1, ok), 3),
                    "loadavg": [round(x, 2) for x in os.getloadavg()],
                }
                print(json.dumps(line), flush=True)


async def register(nats_url: str) -> WorkerRegistration:
    """``MODEL``'s card and one live worker card for it, so the gateway serves it."""
    nc = Client()
    await nc.connect(nats_url)
    subjects = Subjects(NAMESPACE)
    await publish_model_card(nc.jetstream(), subjects, ModelCard(model=MODEL, context_length=4096))
    registration = WorkerRegistration(
        nc.jetstream(), subjects, WorkerCard(worker_id="w1", model=MODEL)
    )
    await registration.start()
    return registration


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_cost", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000, help="at c=64 (c=1: a tenth)")
    parser.add_argument("--chunks", type=int, default=6, help="chunks per request")
    parser.add_argument("--gap-ms", type=float, default=2.0, help="between two chunks")
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[64, 1])
    parser.add_argument("--downstream", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.downstream:
        asyncio.run(downstream(args.downstream, args.chunks, args.gap_ms / 1000))
        return
    asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp, nats_server(Path(tmp) / "js") as (nats_url, _):
        http, grpc_port = free_port(), free_port()
        targets = {"http": f"127.0.0.1:{http}"} | {p: f"127.0.0.1:{grpc_port}" for p in CLIENTS}
        env = {**os.environ, "JETSERVE_NATS_URL": nats_url, "JETSERVE_NAMESPACE": NAMESPACE}
        env["JETSERVE_LOG_LEVEL"] = "warning"
        command = [sys.executable, "-m", "services.gateway", "--http-port", str(http)]
        command += ["--grpc-port", str(grpc_port)]
        gateway = subprocess.Popen(command, env=env)  # noqa: ASYNC220 - as above
        child = [
            "--downstream",
            nats_url,
            "--chunks",
            str(args.chunks),
            "--gap-ms",
            str(args.gap_ms),
        ]
        helper = subprocess.Popen(  # noqa: ASYNC220 - started once, before any load
            [sys.executable, "-m", "bench.gateway_cost", *child], stdout=subprocess.PIPE
        )
        try:
            registration = await register(nats_url)
            wait_for_port(http, timeout_s=30)
            wait_for_port(grpc_port, timeout_s=30)
            assert helper.stdout is not None
            helper.stdout.readline()
            await asyncio.sleep(1.0)  # the gateway sees the worker card
            await measure(args, targets, gateway)
            await registration.stop()
        finally:
            for proc in (helper, gateway):
                proc.terminate()
                proc.wait(timeout=10)


if __name__ == "__main__":
    main()
