"""``nvext.extra_fields: ["timing"]``: time to first token and between batches, measured by the
formatter from the open (``now`` is passed in)."""

from __future__ import annotations

import json
from typing import Any

from services.formatter.request import RequestFormatter
from shared.messages import OutputOptions, StreamOpen, TokenBatch
from tests.unit.formatter.test_shapers_openai_chat import payloads


def timed_open(**output: Any) -> StreamOpen:
    return StreamOpen(
        request_id="r1",
        api="chat",
        model="m",
        reply_to="gw",
        created=1,
        prompt_tokens=4,
        output=OutputOptions(**output),
        max_tokens=64,
    )


def feed(fmt: RequestFormatter, times: list[float]) -> bytes:
    out = b""
    for n, now in enumerate(times):
        last = n == len(times) - 1
        batch = TokenBatch(
            request_id="r1",
            token_ids=(9707,),
            index=n,
            finish_reason="length" if last else None,
            worker_id="w1",
        )
        out += fmt.on_batch(batch, now=now)
    return out


def test_streaming_last_chunk_carries_ttft_and_itl(tokenizer: Any) -> None:
    fmt = RequestFormatter(timed_open(stream=True, extra_fields=("timing",)), tokenizer, now=10)
    objects = payloads(feed(fmt, [10.5, 10.7, 10.9]))
    nvexts = [o.get("nvext") for o in objects[:-1]]
    assert nvexts[-1] == {"timing": {"ttft_ms": 500.0, "itl_ms": 200.0}}
    assert all(n is None for n in nvexts[:-1])


def test_body_carries_timing_and_the_worker(tokenizer: Any) -> None:
    fields = ("timing", "worker_id")
    fmt = RequestFormatter(timed_open(extra_fields=fields), tokenizer, now=1.0)
    body = json.loads(feed(fmt, [1.25]))
    assert body["nvext"] == {"worker_id": "w1", "timing": {"ttft_ms": 250.0, "itl_ms": 0.0}}
