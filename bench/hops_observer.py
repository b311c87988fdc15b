"""The bus observer of ``bench.hops``, run as its own process so that its wake-ups do not delay
the client's loop: ``python -m bench.hops_observer --nats-url URL --out FILE``.

One nats-py connection subscribed to ``>``, which on nats-server 2.x also matches ``$JS.…``,
``$KV.…`` and ``_INBOX.…`` subjects and the deliveries of JetStream consumers (their
``$JS.ACK`` reply tells them apart). For every message it keeps ``(time.time(), subject, reply,
payload size)`` in memory (no write per message); prints ``ready`` once subscribed; on SIGTERM
or SIGINT writes them to FILE as JSON lines and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import nats
from nats.aio.msg import Msg

READY = "ready"


async def observe(url: str, out: Path) -> int:
    """Record every message until a signal; the number recorded."""
    records: list[tuple[float, str, str, int]] = []

    async def on_msg(msg: Msg) -> None:
        records.append((time.time(), msg.subject, msg.reply, len(msg.data)))

    nc = await nats.connect(url, name="jetserve-hops-observer", allow_reconnect=False)
    await nc.subscribe(">", cb=on_msg, pending_msgs_limit=1_000_000, pending_bytes_limit=2**30)
    await nc.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(READY, flush=True)
    await stop.wait()
    await nc.close()
    with out.open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return len(records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hops_observer", description=__doc__)
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    count = asyncio.run(observe(args.nats_url, args.out))
    print(f"recorded {count}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
