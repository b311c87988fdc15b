"""``make bench-fairness``: the load (closed-loop clients on keep-alive connections, one class
header each), the probe and the decision tap."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.fairness_report import (
    CLASS_HEADER,
    CLASSES,
    PREMIUM,
    Decision,
    Done,
    gateway_for,
)
from bench.fairness_settings import DYNAMO_QUEUE_METRIC, REQUEST_TIMEOUT_S, WORDS, Settings
from bench.httpclient import read_body, read_head
from shared.codec import decode
from shared.messages import RouteDecision
from shared.subjects import Subjects

# --- the client ---------------------------------------------------------------------------------


def prompt_text(rng: random.Random, words: int) -> str:
    """A unique prompt: a random 64-bit hex tag, then ``words`` fixed words (every KV block of
    it differs from every other prompt's, since a block's hash covers all before it)."""
    return f"{rng.getrandbits(64):016x} " + _base_text(words)


_BASE: dict[int, str] = {}


def _base_text(words: int) -> str:
    if words not in _BASE:
        pick = random.Random(words)
        vocabulary = WORDS.split()
        _BASE[words] = " ".join(pick.choice(vocabulary) for _ in range(words))
    return _BASE[words]


def chat_body(settings: Settings, text: str) -> bytes:
    body = {
        "model": settings.model_name,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": settings.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(body).encode()


class Connection:
    """One kept-alive HTTP/1.1 connection; ``chat`` posts a streamed chat completion."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def _send(
        self, payload: bytes, cls: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """Send the request; the streams and the status line. A kept-alive connection the
        server closed while idle (no status line) is opened again once, as HTTP clients do."""
        for attempt in range(2):
            opened = attempt > 0 or self.writer is None or self.writer.is_closing()
            if opened:
                await self.close()
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            reader, writer = self.reader, self.writer
            assert reader is not None
            assert writer is not None
            writer.write(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Content-Type: application/json\r\n{CLASS_HEADER}: {cls}\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            with contextlib.suppress(ConnectionError):
                if status_line := await reader.readline():
                    return reader, writer, status_line
            if opened:
                break
        raise ConnectionError("the server closed the connection without an answer")

    async def chat(self, payload: bytes, cls: str) -> tuple[int, float | None, dict[str, Any], str]:
        """Status, TTFT (first text), the final ``usage`` and, on failure, the body's start."""
        start = time.perf_counter()
        reader, writer, status_line = await self._send(payload, cls)
        status = int(status_line.split()[1])
        chunked, length, close = await read_head(reader)
        ttft: float | None = None
        usage: dict[str, Any] = {}
        buffer = b""
        async for data in read_body(reader, chunked, length):
            _quickack(writer)
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                obj = json.loads(event[6:])
                usage = obj.get("usage") or usage
                if ttft is None and _has_text(obj):
                    ttft = time.perf_counter() - start
        if close or status != 200:
            await self.close()
        return status, ttft, usage, "" if status == 200 else buffer[:300].decode(errors="replace")


def _has_text(obj: dict[str, Any]) -> bool:
    return any(
        (c.get("delta") or {}).get("content") or c.get("text") for c in obj.get("choices") or []
    )


def _quickack(writer: asyncio.StreamWriter) -> None:
    """Re-arm TCP_QUICKACK: a server that leaves Nagle on (Dynamo 1.6.1) would otherwise wait
    for our delayed ACK, ~40 ms, on a kept-alive connection."""
    sock = writer.get_extra_info("socket")
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


async def one_request(conn: Connection, payload: bytes, cls: str, gateway: int) -> Done:
    try:
        status, ttft, usage, error = await asyncio.wait_for(
            conn.chat(payload, cls), REQUEST_TIMEOUT_S
        )
    except (OSError, ValueError, IndexError, asyncio.IncompleteReadError, TimeoutError) as exc:
        await conn.close()
        return Done(cls, gateway, 0, time.monotonic(), error=f"{type(exc).__name__}: {exc}")
    details = usage.get("prompt_tokens_details") or {}
    return Done(
        cls,
        gateway,
        status,
        time.monotonic(),
        ttft_s=ttft,
        prompt_tokens=usage.get("prompt_tokens") or 0,
        cached_tokens=details.get("cached_tokens") or 0,
        error=error,
    )


async def client(
    settings: Settings,
    cls: str,
    targets: Sequence[tuple[str, int]],
    rng: random.Random,
    stop_at: float,
    done: list[Done],
) -> None:
    """One closed-loop client of ``cls``: each request draws its gateway, then waits for the
    answer; after a failure it backs off ``error_backoff_s``."""
    conns = [Connection(host, port) for host, port in targets]
    skew = settings.premium_skew if cls == PREMIUM else settings.regular_skew
    try:
        while time.monotonic() < stop_at:
            gateway = gateway_for(rng.random(), skew, len(conns))
            payload = chat_body(settings, prompt_text(rng, settings.prompt_words))
            sent = time.monotonic()
            try:
                result = await one_request(conns[gateway], payload, cls, gateway)
            except asyncio.CancelledError:  # the load stopped: still unanswered
                done.append(Done(cls, gateway, -1, time.monotonic(), start_s=sent))
                raise
            result = replace(result, start_s=sent)
            done.append(result)
            if not result.ok:
                await asyncio.sleep(settings.error_backoff_s)
    finally:
        for conn in conns:
            await conn.close()


@dataclass(slots=True)
class Probe:
    """What is read at the window's two ends (CPU ticks by process, ``/varz``) and sampled each
    second within it (router queue depth by class)."""

    pids: Mapping[str, int]
    varz_url: str | Sequence[str] | None = None
    queue_urls: Sequence[str] = ()
    queue_metric: str = DYNAMO_QUEUE_METRIC
    readings: list[tuple[dict[str, int], dict[str, int]]] = field(default_factory=list)
    queue_samples: list[dict[str, float]] = field(default_factory=list)

    def read_ends(self) -> None:
        self.readings.append((proc_ticks(self.pids), varz(self.varz_url)))

    def sample_queue(self) -> None:
        if self.queue_urls:
            self.queue_samples.append(queue_depth(self.queue_urls, self.queue_metric))

    def queue_depth_mean(self) -> dict[str, float] | None:
        if not self.queue_samples:
            return None
        n, samples = len(self.queue_samples), self.queue_samples
        names = sorted({name for sample in samples for name in sample})
        return {name: round(sum(s.get(name, 0.0) for s in samples) / n, 2) for name in names}


async def drive(
    settings: Settings,
    targets: Sequence[tuple[str, int]],
    probe: Probe,
    seed: int,
    tap: DecisionTap | None = None,
    events: Sequence[tuple[float, Callable[[], None]]] = (),
) -> tuple[list[Done], float, float]:
    """The load for ``warmup_s + duration_s``; the probe read at the window's ends and sampled
    in between; ``tap`` listening throughout; each of ``events`` called that many seconds into
    the window. The finished requests and the window, on the monotonic clock."""
    done: list[Done] = []
    if tap is not None:
        await tap.start()
    begin = time.monotonic()
    window = (begin + settings.warmup_s, begin + settings.warmup_s + settings.duration_s)
    rng = random.Random(seed)
    tasks = [
        asyncio.create_task(
            client(settings, cls, targets, random.Random(rng.getrandbits(64)), window[1], done)
        )
        for cls in CLASSES
        for _ in range(settings.concurrency)
    ]
    timers = [
        asyncio.get_running_loop().call_at(_loop_time(window[0] + at_s), action)
        for at_s, action in events
    ]
    try:
        await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
        await asyncio.to_thread(probe.read_ends)
        while (left := window[1] - time.monotonic()) > 0:
            await asyncio.sleep(min(1.0, left))
            await asyncio.to_thread(probe.sample_queue)
        await asyncio.to_thread(probe.read_ends)
    finally:
        for timer in timers:
            timer.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if tap is not None:
            await tap.stop()
    return done, window[0], window[1]


def _loop_time(monotonic_s: float) -> float:
    """``time.monotonic()`` → the running loop's clock (the same clock on Linux, but not
    promised)."""
    return asyncio.get_running_loop().time() + monotonic_s - time.monotonic()


class DecisionTap:
    """Every ``RouteDecision`` on ``<ns>.v1.decisions`` (a plain subscription: each router
    publishes its decisions to every peer), stamped with the monotonic clock."""

    def __init__(self, nats_url: str, namespace: str) -> None:
        self.nats_url, self.subject = nats_url, Subjects(namespace).decisions
        self.decisions: list[Decision] = []
        self._nc: Any = None

    async def start(self) -> None:
        import nats  # the bench's only NATS client; imported where it is used

        self._nc = await nats.connect(self.nats_url)
        await self._nc.subscribe(self.subject, cb=self._on_decision)
        await self._nc.flush()

    async def _on_decision(self, msg: Any) -> None:
        d = decode(msg.data, RouteDecision)
        self.decisions.append(
            Decision(time.monotonic(), d.router_id, d.policy_class, d.prefill_tokens, d.queued_ms)
        )

    async def stop(self) -> None:
        if self._nc is not None:
            await self._nc.close()
            self._nc = None


# --- what is read from the processes -----------------------------------------------------------


def proc_ticks(pids: Mapping[str, int]) -> dict[str, int]:
    """utime + stime (clock ticks) of each named process still running."""
    out = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = int(fields[11]) + int(fields[12])
    return out


def varz(url: str | Sequence[str] | None) -> dict[str, int]:
    """nats-server's message counters, summed over the servers (``sites``: a message that
    crosses from one node to another counts at both); empty without a monitoring URL or when one
    does not answer."""
    if url is None:
        return {}
    out = {"in_msgs": 0, "out_msgs": 0}
    for one in [url] if isinstance(url, str) else url:
        try:
            with urllib.request.urlopen(one, timeout=5) as response:
                data = json.load(response)
        except (OSError, ValueError):
            return {}
        for key in out:
            out[key] += int(data[key])
    return out


def queue_depth(urls: Sequence[str], metric: str) -> dict[str, float]:
    """Requests waiting in the router queues, summed over ``urls`` (Prometheus text), by the
    ``policy_class`` label where the metric has one, else as ``all``."""
    depth: dict[str, float] = {}
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, rest = line.partition("{")
            if name.split(" ")[0] != metric:
                continue
            cls = rest.partition('policy_class="')[2].partition('"')[0] or "all"
            depth[cls] = depth.get(cls, 0.0) + float(line.rsplit(" ", 1)[1])
    return depth


def pid_files(run_dir: Path) -> dict[str, int]:
    out = {}
    for path in sorted(run_dir.glob("*.pid")):
        with contextlib.suppress(OSError, ValueError):
            out[path.stem] = int(path.read_text().strip())
    return out
