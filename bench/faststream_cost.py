"""CPU per message of a FastStream NATS subscriber and publisher against raw nats-py (decision 014).

FastStream is not a JetServe dependency, so this runs in a scratch venv, from the repo root::

    python3.11 -m venv /tmp/fsvenv
    /tmp/fsvenv/bin/pip install 'faststream[nats]==0.7.8' msgspec structlog uvloop
    /tmp/fsvenv/bin/python -m bench.faststream_cost [--messages 20000] [--rounds 7]

Nothing FastStream-related is imported at module level (the project venv can import this file).
It needs only ``shared.codec`` / ``shared.messages`` (msgspec) from the project, and the project
venv's ``nats-server`` (``--nats-server``, default ``.venv/bin/nats-server``).

Method, as ``bench/handler_cost.py``: a private ``nats-server -js`` on a free loopback port
(stopped by its own pid); a publisher child process (this module with ``--publisher``) sends N
msgpack ``Cancel`` messages (own ``request_id`` each) when asked; this process receives them and
its CPU (``time.process_time``) from the ask until the N-th message is handled, divided by N, is
the receiving cost. The handler decodes with msgspec and counts. Receivers, alternated per round
(first round a warm-up, not reported):

- ``raw``: a raw nats-py callback (``nc.subscribe(cb=...)``) that decodes;
- ``fs_bytes``: ``NatsBroker(logger=None)``, ``@broker.subscriber`` with ``body: bytes`` (the
  default FastDepends/pydantic path), decoded with msgspec in the handler;
- ``fs_no_types``: the same with ``apply_types=False`` (no FastDepends: FastStream's leanest);
- ``fs_typed``: typed handler ``message: Cancel`` through a msgpack decoder and FastDepends'
  msgspec serializer (FastStream's AsyncAPI still cannot document a msgspec Struct: 014);
- ``raw_fspub`` / ``fs_bytes_fspub``: ``raw`` / ``fs_bytes`` receiving messages the child sent
  with FastStream's ``broker.publish`` (it adds ``correlation_id`` and ``content-type`` headers).

Each receiver's own connection is idle while the others run. The publisher's CPU per message is
reported for ``nc.publish`` and ``broker.publish``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from bench.publisher import CONTROL, publisher_child, wait_for_publisher
from shared import codec
from shared.messages import Cancel
from tests.support import nats_server

ROOT = Path(__file__).resolve().parents[1]
# variant -> how the child publishes
VARIANTS: dict[str, str] = {
    "raw": "raw",
    "fs_bytes": "raw",
    "fs_no_types": "raw",
    "fs_typed": "raw",
    "raw_fspub": "faststream",
    "fs_bytes_fspub": "faststream",
}


def payloads(n: int) -> list[bytes]:
    return [codec.encode(Cancel(request_id=f"bench-{i:08d}-0123456789abcdef")) for i in range(n)]


class Sink:
    """The handlers' own work: count, and say when the N-th message arrived."""

    def __init__(self) -> None:
        self.expected = 0
        self.seen = 0
        self.done = asyncio.Event()

    def reset(self, expected: int) -> None:
        self.expected, self.seen = expected, 0
        self.done = asyncio.Event()

    def handle(self, message: Any) -> None:
        self.seen += 1
        if self.seen == self.expected:
            self.done.set()


async def receivers(url: str, sink: Sink) -> tuple[Any, list[Any]]:
    """The raw connection and the FastStream brokers, subscribed on ``bench.<variant>``."""
    import nats
    from fast_depends.msgspec import MsgSpecSerializer
    from faststream.nats import NatsBroker

    decoder = codec.decoder(Cancel)
    decode = decoder.decode
    handle = sink.handle

    nc = await nats.connect(url, name="bench-fs-raw", pending_size=64 * 1024 * 1024)

    async def raw(msg: Any) -> None:
        handle(decode(msg.data))

    for name in ("raw", "raw_fspub"):
        await nc.subscribe(f"bench.{name}", cb=raw)

    plain = NatsBroker(url, logger=None)

    async def fs_bytes(body: bytes) -> None:
        handle(decode(body))

    for name in ("fs_bytes", "fs_bytes_fspub"):
        plain.subscriber(f"bench.{name}")(fs_bytes)

    untyped = NatsBroker(url, logger=None, apply_types=False)

    async def fs_no_types(body: Any) -> None:
        handle(decode(body))

    untyped.subscriber("bench.fs_no_types")(fs_no_types)

    async def msgpack_decoder(msg: Any) -> Any:
        return decode(msg.body)

    typed = NatsBroker(url, logger=None, serializer=MsgSpecSerializer(), decoder=msgpack_decoder)

    async def fs_typed(message: Cancel) -> None:
        handle(message)

    typed.subscriber("bench.fs_typed")(fs_typed)

    brokers = [plain, untyped, typed]
    for broker in brokers:
        await broker.start()
    await nc.flush()
    return nc, brokers


async def run(url: str, args: argparse.Namespace, child: subprocess.Popen[bytes]) -> None:
    sink = Sink()
    nc, brokers = await receivers(url, sink)
    await wait_for_publisher(nc, child, timeout_s=30)
    cpu: dict[str, list[float]] = {v: [] for v in args.variants}
    pub_cpu: dict[str, list[float]] = {"raw": [], "faststream": []}
    for round_no in range(args.rounds + 1):
        k = round_no % len(args.variants)
        for name in args.variants[k:] + args.variants[:k]:
            sink.reset(args.messages)
            request = {"subject": f"bench.{name}", "via": VARIANTS[name]}
            started = time.process_time()
            reply = await nc.request(CONTROL, json.dumps(request).encode(), timeout=120)
            await asyncio.wait_for(sink.done.wait(), 120)
            used = time.process_time() - started
            if round_no == 0:
                continue
            cpu[name].append(used / args.messages * 1e6)
            pub_cpu[VARIANTS[name]].append(json.loads(reply.data)["cpu_s"] / args.messages * 1e6)
    await nc.request(CONTROL, b'{"stop": true}', timeout=10)
    for broker in brokers:
        await broker.stop()
    await nc.drain()
    for name in args.variants:
        _emit(
            mode="nats",
            variant=name,
            cpu_us_per_msg_median=round(statistics.median(cpu[name]), 3),
            cpu_us_per_msg_min=round(min(cpu[name]), 3),
            rounds=[round(x, 2) for x in cpu[name]],
        )
    for name in args.variants:
        if name != "raw" and "raw" in cpu:
            base = "raw_fspub" if name == "fs_bytes_fspub" and "raw_fspub" in cpu else "raw"
            diffs = [x - y for x, y in zip(cpu[name], cpu[base], strict=True)]
            _emit(
                mode="nats",
                overhead=f"{name} - {base}",
                us_per_msg_median=round(statistics.median(diffs), 3),
                us_per_msg_range=[round(min(diffs), 3), round(max(diffs), 3)],
            )
    for via, values in pub_cpu.items():
        if values:
            _emit(
                mode="nats",
                variant=f"publisher_{via}",
                what="nc.publish" if via == "raw" else "FastStream broker.publish(bytes)",
                cpu_us_per_msg_median=round(statistics.median(values), 3),
                cpu_us_per_msg_min=round(min(values), 3),
            )


async def publish_on_request(url: str, n: int) -> None:
    """Publish N messages, raw or through FastStream, to the subject each request names."""
    import nats
    from faststream.nats import NatsBroker

    data = payloads(n)
    nc = await nats.connect(url, name="bench-fs-publisher", pending_size=64 * 1024 * 1024)
    broker = NatsBroker(url, logger=None)
    await broker.start()
    stop = asyncio.Event()

    async def on_control(msg: Any) -> None:
        request = json.loads(msg.data)
        if "subject" in request:
            subject = request["subject"]
            started = time.process_time()
            if request["via"] == "raw":
                for payload in data:
                    await nc.publish(subject, payload)
                await nc.flush()
            else:
                for payload in data:
                    await broker.publish(payload, subject)
                await broker._connection.flush()
            used = time.process_time() - started
            await msg.respond(json.dumps({"cpu_s": used}).encode())
            return
        await msg.respond(b"{}")
        if request.get("stop"):
            stop.set()

    await nc.subscribe(CONTROL, cb=on_control)
    await nc.flush()
    await stop.wait()
    await broker.stop()
    await nc.drain()


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _run(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    uvloop.run(coro)


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("faststream", "fast-depends", "nats-py", "msgspec")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per variant and round")
    parser.add_argument("--rounds", type=int, default=7, help="reported rounds (+1 warm-up)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--nats-server", default=str(ROOT / ".venv" / "bin" / "nats-server"))
    parser.add_argument("--publisher", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    if args.publisher:
        _run(publish_on_request(args.publisher, args.messages))
        return
    _emit(
        bench="faststream_cost",
        kind="cancel",
        messages=args.messages,
        rounds=args.rounds,
        cpus=os.cpu_count(),
        loadavg=[round(x, 2) for x in os.getloadavg()],
        python=platform.python_version(),
        **_versions(),
    )
    with (
        tempfile.TemporaryDirectory() as store,
        nats_server(Path(store), args.nats_server) as (
            url,
            _,
        ),
    ):
        publisher = ["--publisher", url, "--messages", str(args.messages)]
        with publisher_child("bench.faststream_cost", publisher, ROOT) as child:
            _run(run(url, args, child))
    _emit(bench="faststream_cost", loadavg_end=[round(x, 2) for x in os.getloadavg()])


if __name__ == "__main__":
    main()
