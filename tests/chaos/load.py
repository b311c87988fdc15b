"""A bounded streaming load: ``clients`` concurrent loops, each sending streamed chat
completions with the ``openai`` SDK (no SDK retries, a deadline per request) until told to
stop, recording what each request saw as a ``report.RequestRecord``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import openai

from shared.model_dir import DEFAULT_MODEL_NAME
from tests.chaos.report import RequestRecord

PROMPTS = (
    "Tell me about the sea.",
    "Write a haiku about snow.",
    "What is a radix tree?",
    "Name three rivers in Europe.",
    "Why is the sky blue?",
    "Explain backpressure in one paragraph.",
    "Give me a recipe for pancakes.",
    "What does a load balancer do?",
    "Summarize the plot of Hamlet.",
    "How do queue groups work in NATS?",
    "List some prime numbers.",
    "Describe a quiet morning.",
)
"""Short, varied prompts, so requests are not all one cached prefix."""


@dataclass(frozen=True, slots=True)
class LoadConfig:
    base_url: str
    model: str = DEFAULT_MODEL_NAME
    clients: int = 16
    max_tokens: int = 48
    timeout_s: float = 20.0
    """Each request's deadline, from sending it to its last byte (past the stack's own, so the
    stack's typed error arrives first)."""
    max_requests: int = 5000
    """A bound on the whole run, whatever the stop time."""
    pause_after_failure_s: float = 0.2
    """A client waits this long after a failure, so a refusing stack is not spun against."""


async def run_load(config: LoadConfig, stop: asyncio.Event) -> list[RequestRecord]:
    """Run the clients until ``stop`` is set (or ``max_requests``); every request's record."""
    records: list[RequestRecord] = []
    client = openai.AsyncOpenAI(
        base_url=f"{config.base_url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=config.timeout_s,
    )
    try:
        async with asyncio.TaskGroup() as group:
            for index in range(config.clients):
                group.create_task(_client_loop(client, config, index, stop, records))
    finally:
        await client.close()
    return records


async def _client_loop(
    client: openai.AsyncOpenAI,
    config: LoadConfig,
    index: int,
    stop: asyncio.Event,
    records: list[RequestRecord],
) -> None:
    turn = 0
    while not stop.is_set() and len(records) < config.max_requests:
        prompt = PROMPTS[(index + turn * 5) % len(PROMPTS)]
        turn += 1
        record = await one_request(client, config, prompt)
        records.append(record)
        if not record.ok and not stop.is_set():
            await asyncio.sleep(config.pause_after_failure_s)


async def one_request(client: openai.AsyncOpenAI, config: LoadConfig, prompt: str) -> RequestRecord:
    """One streamed chat completion, bounded by ``timeout_s``; never raises."""
    start = time.monotonic()
    seen = _Seen()
    try:
        async with asyncio.timeout(config.timeout_s):
            await _stream(client, config, prompt, seen)
    except openai.APIStatusError as exc:
        seen.note_headers(exc.response.headers)
        return seen.record(start, status=exc.status_code, code=exc.code, error=exc)
    except openai.APITimeoutError as exc:
        return seen.record(start, error=exc, error_class="client_timeout")
    except openai.APIConnectionError as exc:
        return seen.record(start, error=exc, error_class="connection_error")
    except openai.APIError as exc:  # an in-band SSE error event after the headers
        return seen.record(start, code=exc.code, error=exc)
    except TimeoutError as exc:
        return seen.record(start, error=exc, error_class="client_timeout")
    except Exception as exc:  # a harness must record, not crash, whatever the stack does
        return seen.record(start, error=exc)
    if seen.finish_reason is None:
        return seen.record(start, error_class="incomplete_stream")
    return seen.record(start, ok=True)


async def _stream(client: openai.AsyncOpenAI, config: LoadConfig, prompt: str, seen: _Seen) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model=config.model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=config.max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    seen.note_headers(raw.headers)
    stream = raw.parse()
    try:
        async for chunk in stream:
            seen.note_chunk(chunk)
    finally:
        await stream.close()


class _Seen:
    """What one request has received so far."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.first_token_s: float | None = None
        self.finish_reason: str | None = None
        self.completion_tokens: int | None = None
        self.is_migrated = False
        self.request_id: str | None = None

    def note_headers(self, headers: Mapping[str, str]) -> None:
        self.request_id = headers.get("x-request-id")
        if any("migrat" in name.lower() for name in headers):
            self.is_migrated = True

    def note_chunk(self, chunk: Any) -> None:
        for choice in chunk.choices:
            if choice.delta.content:
                if self.first_token_s is None:
                    self.first_token_s = time.monotonic()
                self.text.append(choice.delta.content)
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
        if chunk.usage is not None:
            self.completion_tokens = chunk.usage.completion_tokens
        nvext = (chunk.model_extra or {}).get("nvext")
        if isinstance(nvext, dict) and any("migrat" in key for key in nvext):
            self.is_migrated = True

    def record(
        self,
        start: float,
        *,
        ok: bool = False,
        status: int | None = None,
        code: str | None = None,
        error: BaseException | None = None,
        error_class: str | None = None,
    ) -> RequestRecord:
        return RequestRecord(
            start_s=start,
            end_s=time.monotonic(),
            ok=ok,
            first_token_s=self.first_token_s,
            status=status,
            code=code,
            error_class=error_class or (type(error).__name__ if error is not None else None),
            text="".join(self.text),
            completion_tokens=self.completion_tokens,
            is_migrated=self.is_migrated,
            request_id=self.request_id,
        )
