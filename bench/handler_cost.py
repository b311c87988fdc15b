"""CPU per message of the handler boundary (``shared.handlers.Boundary``) against raw callbacks.

Run: ``.venv/bin/python -m bench.handler_cost [--messages 20000] [--rounds 7] [--kind cancel]``
Prints JSON lines: a header (load average, CPUs), one line per mode and variant, the overheads.

What it measures. A private ``nats-server -js`` (the venv's binary, free loopback port, stopped
by its own pid) and a publisher child process (this module with ``--publisher``, on its own
connection) that sends N pre-encoded msgpack ``Cancel`` (or ``RequestPhase``) messages, each
with its own ``request_id``, when asked. This process receives them on another connection (made
with ``shared.bus.connect``, on uvloop, as the services run) through one of these callbacks:

- ``bare``: a raw nats-py callback that decodes (``codec.decode``) and calls the handler;
- ``hand``: what services wrote before the Boundary (``Router.on_route``): count and time it
  with ``ServiceMetrics.handling``, decode with a try/except, ``bound_contextvars(request_id)``,
  and a try/except ``ServiceError`` / ``Exception`` around the handler;
- ``boundary``: ``Boundary(nc, ServiceMetrics(...)).handler(decoder, kind, fn)``;
- ``lean``: the Boundary's happy path written inline, binding ``request_id`` through the
  ContextVar behind structlog's ``bind_contextvars`` (``Token.var``, fetched once) instead of
  calling ``bind_contextvars`` / ``reset_contextvars`` per message: what the Boundary could cost;
- ``boundary_tasks``: the same Boundary with ``tasks=TaskSet()`` (a task per message);
- ``boundary_log_info`` / ``boundary_log_debug``: the Boundary with a handler that also writes one
  ``log.info`` line (rendered: JSON to /dev/null) or one ``log.debug`` line (filtered out).

The handler itself only counts (and sets an event at N). structlog is configured as the
services configure it (``configure_logging``, INFO, json), its output sent to /dev/null.
Variants alternate within each round (the order rotates); the first round is a warm-up and is
not reported. ``nats`` mode: the receiving process's CPU (``time.process_time``) from asking
the publisher to send until the N-th message is handled, divided by N; the publisher's own CPU
per ``publish`` is reported too. ``inproc`` mode: the same callbacks awaited on N ready-made
``Msg`` objects, no sockets: the wrapper's cost without the noise of nats-py's read path.
Overheads are medians of the per-round differences (``boundary - hand``, ``boundary - bare``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from structlog.contextvars import bind_contextvars, bound_contextvars, reset_contextvars

from bench.publisher import CONTROL, publisher_child, wait_for_publisher
from shared import codec
from shared.bus import connect
from shared.errors import InternalError, ServiceError
from shared.handlers import Boundary
from shared.logging import configure_logging
from shared.messages import Cancel, Message, RequestPhase
from shared.metrics import ServiceMetrics
from shared.tasks import TaskSet
from tests.support import nats_server

log = structlog.get_logger("bench.handler_cost")

KINDS: dict[str, type[Message]] = {"cancel": Cancel, "phase": RequestPhase}
VARIANTS = (
    "bare",
    "hand",
    "boundary",
    "lean",
    "boundary_tasks",
    "boundary_log_info",
    "boundary_log_debug",
)
Callback = Callable[[Msg], Awaitable[None]]


def payloads(kind: str, n: int) -> list[bytes]:
    """N encoded messages of ``kind``, each with its own request id."""
    out = []
    for i in range(n):
        request_id = f"bench-{i:08d}-0123456789abcdef"
        if kind == "cancel":
            message: Message = Cancel(request_id=request_id)
        else:
            message = RequestPhase(
                request_id=request_id, worker_id="mocker-1", phase="finished", ts=time.time()
            )
        out.append(codec.encode(message))
    return out


class Sink:
    """The handlers' own work: count, and say when the N-th message arrived."""

    def __init__(self) -> None:
        self.expected = 0
        self.seen = 0
        self.done = asyncio.Event()

    def reset(self, expected: int) -> None:
        self.expected, self.seen = expected, 0
        self.done = asyncio.Event()

    async def handle(self, message: Any) -> None:
        self.seen += 1
        if self.seen == self.expected:
            self.done.set()

    async def handle_log_info(self, message: Any) -> None:
        log.info("bench_message_handled", n=self.seen)
        await self.handle(message)

    async def handle_log_debug(self, message: Any) -> None:
        log.debug("bench_message_handled", n=self.seen)
        await self.handle(message)


def callbacks(nc: Client, kind: type[Message], sink: Sink) -> dict[str, Callback]:
    """One subscription callback per variant, all ending in ``sink``."""
    metrics = ServiceMetrics("bench")
    boundary = Boundary(nc, metrics)
    decoder = codec.decoder(kind)
    handle = sink.handle

    async def bare(msg: Msg) -> None:
        await handle(codec.decode(msg.data, kind))

    async def hand(msg: Msg) -> None:  # as Router.on_route was written
        with metrics.handling("bench"):
            try:
                message = codec.decode(msg.data, kind)
            except codec.DecodeError as exc:
                log.warning("bad_message", subject=msg.subject, error=str(exc))
                return
            with bound_contextvars(request_id=message.request_id):
                try:
                    await handle(message)
                except ServiceError as exc:
                    log.warning("request_rejected", code=exc.code, error=exc.message)
                    metrics.error(exc.code)
                except Exception:
                    log.exception("request_failed")
                    metrics.error(InternalError.code)

    stats = metrics.handlers.labels("bench", "lean")
    tokens = bind_contextvars(request_id=...)  # the ContextVar structlog binds request_id to
    request_id_var = tokens["request_id"].var
    reset_contextvars(**tokens)
    perf_counter = time.perf_counter

    async def lean(msg: Msg) -> None:
        try:
            message = decoder.decode(msg.data)
        except codec.DecodeError as exc:
            log.warning("bad_message", subject=msg.subject, error=str(exc))
            return
        token = request_id_var.set(message.request_id)
        started = perf_counter()
        try:
            await handle(message)
        except ServiceError as exc:
            log.warning("request_failed", code=exc.code, error=exc.message)
        except Exception:
            log.exception("request_crashed")
        finally:
            stats.observe(perf_counter() - started)
            request_id_var.reset(token)

    return {
        "bare": bare,
        "lean": lean,
        "hand": hand,
        "boundary": boundary.handler(decoder, "bench", handle),
        "boundary_tasks": boundary.handler(decoder, "bench_tasks", handle, tasks=TaskSet()),
        "boundary_log_info": boundary.handler(decoder, "bench_info", sink.handle_log_info),
        "boundary_log_debug": boundary.handler(decoder, "bench_debug", sink.handle_log_debug),
    }


def rotated(names: tuple[str, ...], round_no: int) -> Iterator[str]:
    """The variants in an order that rotates each round."""
    k = round_no % len(names)
    yield from names[k:] + names[:k]


async def run_nats(url: str, args: argparse.Namespace, publisher: subprocess.Popen[bytes]) -> None:
    kind = KINDS[args.kind]
    nc = await connect(url, name="bench-handler-cost-receiver")
    sink = Sink()
    for name, cb in callbacks(nc, kind, sink).items():
        await nc.subscribe(f"bench.{name}", cb=cb)
    await nc.flush()
    await wait_for_publisher(nc, publisher, timeout_s=20)
    cpu: dict[str, list[float]] = {v: [] for v in args.variants}
    pub_cpu: dict[str, list[float]] = {v: [] for v in args.variants}
    for round_no in range(args.rounds + 1):
        for name in rotated(args.variants, round_no):
            sink.reset(args.messages)
            started = time.process_time()
            reply = await nc.request(
                CONTROL, json.dumps({"subject": f"bench.{name}"}).encode(), timeout=120
            )
            await asyncio.wait_for(sink.done.wait(), 120)
            used = time.process_time() - started
            if round_no == 0:
                continue  # warm-up
            cpu[name].append(used / args.messages * 1e6)
            pub_cpu[name].append(json.loads(reply.data)["cpu_s"] / args.messages * 1e6)
            if name == "boundary_tasks":
                await asyncio.sleep(0.05)  # let the last tasks finish before the next variant
    await nc.request(CONTROL, b'{"stop": true}', timeout=10)
    await nc.drain()
    _report("nats", args, cpu)
    publish = [x for v in pub_cpu.values() for x in v]
    _emit(
        mode="nats",
        variant="publisher",
        what="raw nc.publish, CPU us per message in the publisher process",
        cpu_us_per_msg_median=round(statistics.median(publish), 3),
        cpu_us_per_msg_min=round(min(publish), 3),
    )


async def run_inproc(args: argparse.Namespace) -> None:
    """The callbacks awaited on ready-made messages: no socket, no nats-py read path."""
    kind = KINDS[args.kind]
    nc = Client()  # never connected: the happy path publishes nothing
    sink = Sink()
    cbs = callbacks(nc, kind, sink)
    messages = [
        Msg(_client=nc, subject="bench.x", data=d) for d in payloads(args.kind, args.inproc)
    ]
    cpu: dict[str, list[float]] = {v: [] for v in args.variants}
    for round_no in range(args.rounds + 1):
        for name in rotated(args.variants, round_no):
            cb = cbs[name]
            sink.reset(len(messages))
            started = time.process_time()
            for msg in messages:
                await cb(msg)
            await sink.done.wait()
            used = time.process_time() - started
            if round_no:
                cpu[name].append(used / len(messages) * 1e6)
            if name == "boundary_tasks":
                await asyncio.sleep(0)
    _report("inproc", args, cpu)


def _report(mode: str, args: argparse.Namespace, cpu: dict[str, list[float]]) -> None:
    for name in args.variants:
        _emit(
            mode=mode,
            variant=name,
            cpu_us_per_msg_median=round(statistics.median(cpu[name]), 3),
            cpu_us_per_msg_min=round(min(cpu[name]), 3),
            rounds=[round(x, 2) for x in cpu[name]],
        )
    for a, b in (
        ("boundary", "hand"),
        ("boundary", "bare"),
        ("hand", "bare"),
        ("boundary", "lean"),
        ("lean", "bare"),
        ("boundary_tasks", "boundary"),
        ("boundary_log_info", "boundary"),
        ("boundary_log_debug", "boundary"),
    ):
        if a in cpu and b in cpu:
            diffs = [x - y for x, y in zip(cpu[a], cpu[b], strict=True)]
            _emit(
                mode=mode,
                overhead=f"{a} - {b}",
                us_per_msg_median=round(statistics.median(diffs), 3),
                us_per_msg_range=[round(min(diffs), 3), round(max(diffs), 3)],
            )


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


@contextlib.contextmanager
def logging_to_devnull() -> Iterator[None]:
    """``configure_logging`` as the services call it, but its lines go to /dev/null."""
    with open(os.devnull, "w", encoding="utf-8") as devnull:
        saved, sys.stderr = sys.stderr, devnull
        try:
            configure_logging(service="bench", level="INFO", fmt="json")
        finally:
            sys.stderr = saved
        yield


# --- the publisher child -------------------------------------------------------------------------


async def publish_on_request(url: str, kind: str, n: int) -> None:
    """Connect, then publish N messages to the subject each control request names."""
    data = payloads(kind, n)
    nc = await connect(url, name="bench-handler-cost-publisher")
    stop = asyncio.Event()

    async def on_control(msg: Msg) -> None:
        request = json.loads(msg.data)
        if "subject" in request:
            subject = request["subject"]
            started = time.process_time()
            for payload in data:
                await nc.publish(subject, payload)
            await nc.flush()
            await msg.respond(json.dumps({"cpu_s": time.process_time() - started}).encode())
            return
        await msg.respond(b"{}")
        if request.get("stop"):
            stop.set()

    await nc.subscribe(CONTROL, cb=on_control)
    await nc.flush()
    await stop.wait()
    await nc.drain()


# --- main ----------------------------------------------------------------------------------------


def _run(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        asyncio.run(coro)
        return
    uvloop.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per variant and round")
    parser.add_argument("--inproc", type=int, default=200_000, help="messages, in-process mode")
    parser.add_argument("--rounds", type=int, default=7, help="reported rounds (+1 warm-up)")
    parser.add_argument("--kind", choices=sorted(KINDS), default="cancel")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--modes", default="inproc,nats")
    parser.add_argument("--publisher", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.variants = tuple(v for v in args.variants.split(",") if v)
    with logging_to_devnull():
        if args.publisher:
            _run(publish_on_request(args.publisher, args.kind, args.messages))
            return
        _emit(
            bench="handler_cost",
            kind=args.kind,
            messages=args.messages,
            inproc_messages=args.inproc,
            rounds=args.rounds,
            cpus=os.cpu_count(),
            loadavg=[round(x, 2) for x in os.getloadavg()],
            python=platform.python_version(),
        )
        modes = args.modes.split(",")
        if "inproc" in modes:
            _run(run_inproc(args))
        if "nats" in modes:
            with tempfile.TemporaryDirectory() as store, nats_server(Path(store)) as (url, _):
                publisher = [
                    "--publisher",
                    url,
                    "--kind",
                    args.kind,
                    "--messages",
                    str(args.messages),
                ]
                root = Path(__file__).resolve().parents[1]
                with publisher_child("bench.handler_cost", publisher, root) as child:
                    _run(run_nats(url, args, child))
        _emit(bench="handler_cost", loadavg_end=[round(x, 2) for x in os.getloadavg()])


if __name__ == "__main__":
    main()
