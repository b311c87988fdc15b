"""A minimal keep-alive HTTP/1.1 streaming client on asyncio streams (far cheaper than httpx)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Record:
    ok: bool = False
    status: int = 0
    ttft_s: float | None = None
    e2e_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None

    def text_arrived(self, t0: float, last: float | None) -> float:
        """Text came now: the TTFT (first text since ``t0``) or a gap since ``last``; now."""
        now = time.perf_counter()
        if last is None:
            self.ttft_s = now - t0
        else:
            self.gaps_s.append(now - last)
        return now


class Connection:
    """One kept-alive connection; ``stream_chat`` posts a body and reads the SSE reply."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _ensure(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is None or self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(
                self.host, self.port, limit=2**20
            )
        return self.reader, self.writer

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None

    async def post_stream(self, path: str, body: dict[str, Any]) -> Record:
        reader, writer = await self._ensure()
        payload = json.dumps(body).encode()
        rec = Record()
        t0 = time.perf_counter()
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        status_line = await reader.readline()
        rec.status = int(status_line.split()[1])
        chunked, length, close = await read_head(reader)
        last: float | None = None
        buffer = b""
        async for data in read_body(reader, chunked, length):
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                obj = json.loads(event[6:])
                last = _on_event(rec, obj, t0, last)
        rec.e2e_s = time.perf_counter() - t0
        rec.ok = rec.status == 200 and rec.ttft_s is not None
        if not rec.ok:
            rec.error = f"status {rec.status}: {buffer[:200]!r}"
        if close:
            await self.close()
        return rec


def _on_event(rec: Record, obj: dict[str, Any], t0: float, last: float | None) -> float | None:
    usage = obj.get("usage")
    if usage:
        rec.completion_tokens = usage.get("completion_tokens") or 0
        rec.prompt_tokens = usage.get("prompt_tokens") or 0
        rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    for choice in obj.get("choices") or []:
        text = (choice.get("delta") or {}).get("content") or choice.get("text")
        if text:
            return rec.text_arrived(t0, last)
    return last


async def read_head(reader: asyncio.StreamReader) -> tuple[bool, int | None, bool]:
    """A response's header lines, read: chunked?, its Content-Length, Connection: close?"""
    chunked, length, close = False, None, False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        key, _, value = line.decode().partition(":")
        key, value = key.strip().lower(), value.strip().lower()
        chunked |= key == "transfer-encoding" and "chunked" in value
        close |= key == "connection" and value == "close"
        if key == "content-length":
            length = int(value)
    return chunked, length, close


async def read_body(reader: asyncio.StreamReader, chunked: bool, length: int | None) -> Any:
    """A response's body as it comes (each chunk of a chunked one)."""
    if chunked:
        while True:
            size = int((await reader.readline()).strip(), 16)
            if size == 0:
                await reader.readline()
                return
            yield await reader.readexactly(size)
            await reader.readline()
    elif length is not None:
        yield await reader.readexactly(length)
    else:
        yield await reader.read()
