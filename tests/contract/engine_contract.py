"""The worker contract, engine-independent: what a worker must do on the bus, whatever runs the
model. Each check takes a started ``WorkerUnderTest`` (a ``WorkerProcess`` with one worker on a
real nats-server) and drives it with bus messages only, as the router and formatter do.

Run by ``tests/integration/test_engine_contract.py`` (the mocker and the vLLM fakes, in
``make test``) and ``tests/engines/`` (the transformers engine, ``make test-engines``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client

from shared import codec
from shared.hashing import prefix_hashes
from shared.messages import (
    BlockStored,
    Cancel,
    Generate,
    KvEventBatch,
    ModelCard,
    RequestFailed,
    SamplingParams,
    TokenBatch,
)
from shared.registry import WorkerDirectory
from shared.registry.model_files import ModelFiles
from shared.subjects import Subjects
from tests.support import eventually_async, eventually_awaited

TIMEOUT_S = 30.0
"""One request's whole stream on the slowest engine here (transformers on a CPU)."""


@dataclass(frozen=True, slots=True)
class WorkerUnderTest:
    """A started worker and what the checks need to talk to it."""

    nc: Client
    subjects: Subjects
    worker_id: str
    model: str
    kind: str
    """The card's ``kind`` the engine must report."""
    has_kv_events: bool = True
    long_max_tokens: int = 4000
    """A ``max_tokens`` this engine will not reach before a cancel sent after its first token."""


@dataclass(slots=True)
class Outcome:
    batches: list[TokenBatch]
    failed: RequestFailed | None = None

    @property
    def tokens(self) -> list[int]:
        return [t for b in self.batches if b.choice == 0 for t in b.token_ids]

    @property
    def finish_reason(self) -> str | None:
        return self.batches[-1].finish_reason if self.batches else None


def prompt(n: int, start: int = 1000) -> tuple[int, ...]:
    """``n`` ordinary token ids (no special tokens) from ``start``."""
    return tuple(range(start, start + n))


async def send(
    w: WorkerUnderTest,
    token_ids: tuple[int, ...],
    sampling: SamplingParams,
    *,
    request_id: str | None = None,
    attempt: int = 0,
    resumed_tokens: int = 0,
    model: str | None = None,
    after_first: Callable[[str], object] | None = None,
) -> Outcome:
    """Send one ``Generate`` straight to the worker; collect its stream until it ends."""
    request_id = request_id or uuid.uuid4().hex
    stream_to = w.subjects.stream("contract", request_id)
    sub = await w.nc.subscribe(stream_to)
    gen = Generate(
        request_id=request_id,
        model=model or w.model,
        token_ids=token_ids,
        sampling=sampling,
        stream_to=stream_to,
        attempt=attempt,
        resumed_tokens=resumed_tokens,
    )
    await w.nc.publish(w.subjects.generate(w.worker_id), codec.encode(gen))
    out = Outcome([])
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while True:
            msg = await sub.next_msg(timeout=max(0.1, deadline - time.monotonic()))
            kind = codec.decode(msg.data, TokenBatch | RequestFailed)  # type: ignore[arg-type]
            if isinstance(kind, RequestFailed):
                out.failed = kind
                return out
            out.batches.append(kind)
            if len(out.batches) == 1 and after_first is not None:
                after_first(request_id)
            if kind.finish_reason is not None:
                return out
    finally:
        await sub.unsubscribe()


def greedy(max_tokens: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, greedy=True, temperature=0.0, **kw)  # type: ignore[arg-type]


# --- the checks ----------------------------------------------------------------------------------


async def check_cards(w: WorkerUnderTest) -> None:
    """The worker's card is live with the engine's facts; the model's card and files are out."""
    directory = WorkerDirectory(w.nc.jetstream(), w.subjects)
    await directory.start()
    try:
        cards = await eventually_async(
            lambda: [c for c in directory.live(w.model) if c.worker_id == w.worker_id],
            timeout_s=5,
            interval_s=0.05,
            message="the worker's card is not in the registry",
        )
    finally:
        await directory.stop()
    card = cards[0]
    assert card.kind == w.kind
    assert card.block_size > 0
    assert card.context_length > 0
    assert card.kv_events is w.has_kv_events
    model_card = await ModelFiles(w.nc.jetstream(), w.subjects).card(w.model)
    assert isinstance(model_card, ModelCard)
    assert model_card.context_length == card.context_length
    assert model_card.eos_token_ids


async def check_streaming_and_max_tokens(w: WorkerUnderTest) -> None:
    """Batches are contiguous, the first says the prompt's size, ``max_tokens`` ends it."""
    out = await send(w, prompt(40), greedy(12, ignore_eos=True))
    assert out.failed is None
    assert out.finish_reason == "length"
    assert len(out.tokens) == 12
    assert out.batches[0].prompt_tokens == 40
    index = 0
    for batch in out.batches:
        assert batch.index == index
        assert batch.worker_id == w.worker_id
        index += len(batch.token_ids)
    # Streamed as generated: tokens come between the first one and the finish (an engine
    # that buffered everything until the end would send two batches).
    assert len(out.batches) > 2, [len(b.token_ids) for b in out.batches]


async def check_greedy_is_repeatable(w: WorkerUnderTest) -> None:
    first = await send(w, prompt(24, 2000), greedy(8, ignore_eos=True))
    second = await send(w, prompt(24, 2000), greedy(8, ignore_eos=True))
    assert first.tokens == second.tokens
    assert len(first.tokens) == 8


async def check_stop_token_ids(w: WorkerUnderTest) -> None:
    """A stop id ends the request at its first occurrence, named and counted."""
    seen = await send(w, prompt(24, 3000), greedy(10, ignore_eos=True))
    stop = seen.tokens[3]
    at = seen.tokens.index(stop)
    out = await send(w, prompt(24, 3000), greedy(10, ignore_eos=True, stop_token_ids=(stop,)))
    assert out.finish_reason == "stop"
    assert out.batches[-1].stop_token_id == stop
    assert out.tokens == seen.tokens[: at + 1]


async def check_cancel(w: WorkerUnderTest) -> None:
    """A cancel after the first token ends the stream ``cancelled``, well before max_tokens."""

    def cancel(request_id: str) -> None:
        message = codec.encode(Cancel(request_id=request_id, reason="test"))
        asyncio.get_running_loop().create_task(w.nc.publish(w.subjects.cancel, message))

    out = await send(
        w, prompt(16, 4000), greedy(w.long_max_tokens, ignore_eos=True), after_first=cancel
    )
    assert out.failed is None
    assert out.finish_reason == "cancelled"
    assert len(out.tokens) < w.long_max_tokens


async def check_migration_hand_off(w: WorkerUnderTest) -> None:
    """A migrated attempt (its earlier output resumed as prompt) is served and echoes its
    attempt; a stale attempt of the same request is ignored."""
    original = prompt(20, 5000)
    first = await send(w, original, greedy(8, ignore_eos=True))
    resumed = original + tuple(first.tokens[:3])
    request_id = uuid.uuid4().hex
    out = await send(
        w, resumed, greedy(5, ignore_eos=True), request_id=request_id, attempt=2, resumed_tokens=3
    )
    assert out.failed is None
    assert out.finish_reason == "length"
    assert {b.attempt for b in out.batches} == {2}
    assert len(out.tokens) == 5


async def check_errors_are_typed(w: WorkerUnderTest) -> None:
    too_long = await send(w, prompt(8), greedy(10_000_000))
    assert too_long.failed is not None
    assert too_long.failed.code == "context_length_exceeded"
    unknown = await send(w, prompt(8), greedy(4), model="no-such-model")
    assert unknown.failed is not None
    assert unknown.failed.code == "model_not_found"


async def check_kv_events(w: WorkerUnderTest, block_size: int) -> None:
    """The prompt's full blocks are announced with JetServe's hashes (or, for an engine
    without KV events, its card says so and nothing is stored)."""
    tokens = prompt(block_size * 3 + 1, 7000)
    out = await send(w, tokens, greedy(2, ignore_eos=True))
    assert out.failed is None
    expected = prefix_hashes(tokens, block_size)
    js = w.nc.jetstream()

    async def stored() -> list[int]:
        """The hashes of every block the worker has announced on the KV stream so far."""
        hashes: list[int] = []
        info = await js.stream_info(w.subjects.kv_stream)
        for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
            msg = await js.get_msg(w.subjects.kv_stream, seq)
            batch = codec.decode(msg.data or b"", KvEventBatch)
            if batch.worker_id != w.worker_id:
                continue
            for event in batch.events:
                if isinstance(event, BlockStored):
                    hashes.extend(event.block_hashes)
        return hashes

    async def all_stored() -> bool:
        return set(expected) <= set(await stored())

    if w.has_kv_events:
        await eventually_awaited(
            all_stored, timeout_s=5, interval_s=0.1, message="the prompt's blocks were not stored"
        )
    else:
        assert not await stored()


CHECKS = {
    "cards": check_cards,
    "streaming": check_streaming_and_max_tokens,
    "greedy": check_greedy_is_repeatable,
    "stop_ids": check_stop_token_ids,
    "cancel": check_cancel,
    "migration": check_migration_hand_off,
    "errors": check_errors_are_typed,
}
"""Every check but ``check_kv_events`` (which takes the engine's block size)."""
