"""Run inside a JetServe container by ``test_cluster.py`` (``python - < cluster_probe.py``).

Prints one JSON line: the workers bucket's cards, each JetStream resource's replicas and current
followers, and (``JETSERVE_CHECK_OVERLAP=1``) whether a repeated new prompt is routed with
overlap learned from the KV-event stream (cached there, not only in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import urllib.request
import uuid
from typing import Any

import nats
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from shared import codec
from shared.messages import RouteDecision, WorkerCard
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.subjects import Subjects

WORDS = "the quick brown fox jumps over a lazy dog while seven wise owls watch it " * 6
"""About nine KV blocks of 16 tokens once templated."""
GATEWAY = "http://127.0.0.1:8000/v1/chat/completions"
MAX_TRIES, MAX_WAIT_S = 30, 25.0


def chat(prompt: str) -> str:
    """One non-streamed request through this container's gateway; its request id."""
    body = {
        "model": DEFAULT_MODEL_NAME,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": prompt}],
    }
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(GATEWAY, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=30) as resp:
        return str(json.load(resp)["id"]).removeprefix("chatcmpl-")


async def streams(js: JetStreamContext, subjects: Subjects) -> dict[str, Any]:
    """Replicas, leader and current followers of every resource the services replicate."""
    found = {}
    for name in (
        subjects.kv_stream,
        f"KV_{subjects.workers_bucket}",
        f"OBJ_{subjects.models_store}",
        f"OBJ_{subjects.router_store}",
        f"KV_{subjects.router_lease_bucket}",
    ):
        info = await js.stream_info(name)
        cluster = info.cluster
        peers = (cluster.replicas if cluster else None) or []
        found[name] = {
            "replicas": info.config.num_replicas,
            "leader": cluster.leader if cluster else None,
            "current_followers": sum(1 for p in peers if p.current and not p.offline),
        }
    return found


async def overlap(nc: Client, subjects: Subjects) -> dict[str, Any]:
    """Send a new prompt, then again until a router routes it with cached (not in-flight)
    overlap: the first request's KV events reached the routers through the stream."""
    decisions: dict[str, RouteDecision] = {}

    async def on_decision(msg: Msg) -> None:
        decision = codec.decode(msg.data, RouteDecision)
        decisions[decision.request_id] = decision

    await nc.subscribe(subjects.decisions, cb=on_decision)
    await nc.flush()
    prompt = f"{uuid.uuid4().hex} {WORDS}"  # a new prefix: nothing is cached before the first
    t0 = time.monotonic()
    routed = [await asyncio.to_thread(chat, prompt)]
    cached = None
    while cached is None and len(routed) <= MAX_TRIES and time.monotonic() - t0 < MAX_WAIT_S:
        await asyncio.sleep(0.5)
        routed.append(await asyncio.to_thread(chat, prompt))
        await asyncio.sleep(0.1)
        d = decisions.get(routed[-1])
        if d is None or d.overlap_blocks == 0:
            continue
        chosen = [c for c in d.candidates if c.worker_id == d.worker_id]
        if not any(c.inflight_blocks for c in chosen):
            cached = d
    first = decisions.get(routed[0])
    return {
        "first_overlap_blocks": first.overlap_blocks if first else None,
        "cached_overlap_blocks": cached.overlap_blocks if cached else None,
        "cached_prompt_blocks": cached.prompt_blocks if cached else None,
        "cached_mode": cached.mode if cached else None,
        "overlap_after_s": round(time.monotonic() - t0, 2) if cached else None,
        "overlap_tries": len(routed) - 1,
    }


async def main() -> None:
    subjects = Subjects(os.environ["JETSERVE_NAMESPACE"])
    nc = await nats.connect(os.environ["JETSERVE_NATS_URL"].split(","), connect_timeout=5)
    js = nc.jetstream()
    kv = await js.key_value(subjects.workers_bucket)
    # The keys from the stream leader's own count per subject, not from a watcher: an ordered
    # consumer made just after a leader change can start with no pending messages (empty keys).
    stream = f"KV_{subjects.workers_bucket}"
    info = await js.stream_info(stream, subjects_filter=f"$KV.{subjects.workers_bucket}.>")
    keys = [s.split(".", 2)[2] for s in (info.state.subjects or {})]
    cards = []
    for key in keys:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):  # deleted or expired since
            cards.append(codec.decode((await kv.get(key)).value or b"", WorkerCard))
    result: dict[str, Any] = {
        "workers": {c.worker_id: c.heartbeat_at for c in cards},
        "workers_bucket_messages": info.state.messages,
        "streams": await streams(js, subjects),
    }
    if os.environ.get("JETSERVE_CHECK_OVERLAP") == "1":
        result.update(await overlap(nc, subjects))
    print(json.dumps(result))  # the test reads this line
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
