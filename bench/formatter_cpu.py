"""Formatter CPU per 64-token request, batches of 8 and of 1, with the Qwen3 tokenizer.

Run: ``.venv/bin/python -m bench.formatter_cpu`` — (1) in-process with a fake bus: the direct
open's handler, then the stream subscription's callback (handler boundary + decode + detokenize
+ shape + encode, no sockets); (2) ``python -m services.formatter`` as a subprocess on a private
nats-server, its CPU read from /proc.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.msg import Msg

from services.formatter.config import FormatterConfig
from services.formatter.detokenizer import load_tokenizer
from services.formatter.service import FormatterService
from services.formatter.tokenizer_cache import TokenizerCache
from shared import codec
from shared.logging import configure_logging
from shared.messages import ModelCard, OutputOptions, StreamOpen, StreamOpened, TokenBatch
from shared.model_dir import DEFAULT_MODEL_NAME, ensure_default_model_dir
from shared.registry import publish_model
from shared.subjects import Subjects
from tests.support import nats_server

TOKENS = 64
TEXT = (Path(__file__).resolve().parents[1] / "docs" / "flow.md").read_text(encoding="utf-8")
CASES: dict[str, OutputOptions] = {
    "stream+usage": OutputOptions(stream=True, include_usage=True),
    "stream+stop": OutputOptions(stream=True, stop=("\n\n\n", "</answer>")),
    "non-stream": OutputOptions(),
    # A plain Qwen3 chat request as the preprocessor sends it: thinking is not off, so the
    # reasoning parser watches the output (decision 019).
    "stream+qwen3": OutputOptions(stream=True, reasoning_parser="qwen3"),
}


def _open(request_id: str, output: OutputOptions, reply_to: str) -> StreamOpen:
    return StreamOpen(
        request_id=request_id,
        api="chat",
        model=DEFAULT_MODEL_NAME,
        reply_to=reply_to,
        created=int(time.time()),
        prompt_tokens=32,
        output=output,
        max_tokens=TOKENS,
    )


def _batches(request_id: str, ids: list[int], size: int) -> list[bytes]:
    out = []
    for start in range(0, TOKENS, size):
        last = start + size >= TOKENS
        batch = TokenBatch(
            request_id=request_id,
            token_ids=tuple(ids[start : start + size]),
            index=start,
            finish_reason="length" if last else None,
            cached_tokens=16 if start == 0 else 0,
        )
        out.append(codec.encode(batch))
    return out


class _FakeNc:
    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: Any = None
    ) -> None:
        pass


async def in_process(tokenizer: Any, ids: list[int], requests: int = 2000) -> None:
    config = FormatterConfig(formatter_id="f1")
    cache = TokenizerCache(lambda _: asyncio.sleep(0, None))
    cache._ready[DEFAULT_MODEL_NAME] = tokenizer  # bench only: skip the registry
    service = FormatterService(config, _FakeNc(), subjects=Subjects(), tokenizers=cache)  # type: ignore[arg-type]
    on_stream = service._on_stream_msg  # what the stream subscription calls
    for size in (8, 1):
        for name, output in CASES.items():
            work = []
            for n in range(requests):
                rid = f"b{size}-{name}-r{n}"  # unique: an id seen before is dropped as done
                msgs = [Msg(None, subject=f"s.{rid}", data=b) for b in _batches(rid, ids, size)]  # type: ignore[arg-type]
                work.append((_open(rid, output, "gw"), msgs))
            started = time.process_time()
            for open_, msgs in work:
                await service.on_open_direct(open_)
                for msg in msgs:
                    await on_stream(msg)
            per_req_us = (time.process_time() - started) / requests * 1e6
            print(f"in-process  batch={size:<2} {name:<13} {per_req_us:8.1f} µs CPU / request")


async def over_nats(model_dir: Path, ids: list[int], requests: int = 3000) -> None:
    with tempfile.TemporaryDirectory() as store, nats_server(Path(store)) as (url, _):
        subjects = Subjects("bench")
        nc = await nats.connect(url)
        card = ModelCard(model=DEFAULT_MODEL_NAME, context_length=40960)
        await publish_model(nc.jetstream(), subjects, card, model_dir)
        command = [sys.executable, "-m", "services.formatter", "--nats-url", url]
        command += ["--namespace", "bench", "--log-level", "WARNING"]
        proc = subprocess.Popen(command)  # noqa: ASYNC220 - a bench, started once
        try:
            for size in (8, 1):
                await _drive(nc, subjects, proc.pid, ids, size, requests)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            await nc.drain()


async def _drive(nc: Any, subjects: Subjects, pid: int, ids: list[int], size: int, n: int) -> None:
    done = asyncio.Event()
    finished = 0

    async def on_reply(msg: Msg) -> None:
        nonlocal finished
        if codec.decode(msg.data, dict).get("done"):
            finished += 1
            if finished == n:
                done.set()

    await nc.subscribe(subjects.reply_all("gw"), cb=on_reply)
    output = OutputOptions(stream=True, include_usage=True)
    opened = []
    for i in range(n):
        rid = f"s{size}r{i}"
        open_ = _open(rid, output, subjects.reply("gw", rid))
        reply = await _request_when_up(nc, subjects.formatter_open, codec.encode(open_))
        opened.append((rid, codec.decode(reply.data, StreamOpened).stream_to))
    before = _cpu_s(pid)
    for rid, stream_to in opened:
        for data in _batches(rid, ids, size):
            await nc.publish(stream_to, data)
    await asyncio.wait_for(done.wait(), 120)
    per_req_us = (_cpu_s(pid) - before) / n * 1e6
    print(f"over NATS   batch={size:<2} stream+usage  {per_req_us:8.1f} µs CPU / request (process)")


async def _request_when_up(nc: Any, subject: str, data: bytes) -> Msg:
    """``nc.request``, retried while the formatter subprocess is still starting."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await nc.request(subject, data, timeout=30)  # type: ignore[no-any-return]
        except nats.errors.NoRespondersError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    configure_logging(service="bench", level="WARNING")
    model_dir = ensure_default_model_dir(Path(tempfile.gettempdir()) / "jetserve-bench-qwen3")
    tokenizer = load_tokenizer((model_dir / "tokenizer.json").read_bytes())
    ids = list(tokenizer.encode(TEXT, add_special_tokens=False).ids[:TOKENS])
    asyncio.run(in_process(tokenizer, ids))
    asyncio.run(over_nats(model_dir, ids))


if __name__ == "__main__":
    main()
