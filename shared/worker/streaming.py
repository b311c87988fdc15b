"""Base of engines whose requests stream their own output (vLLM in-process or remote,
transformers): one task per request, ``run`` returns when none is left.

A subclass says how to start one request (``stream``: an async iterator of ``Emission``s, the
last one ``done``) and how to stop one early (``abort``); it may keep KV events in
``self.kv_events`` for ``take_kv_events``. The base does the bookkeeping every such engine needs:
admission into a pending queue, one driver task per request, cancellation (the driver's
``stream`` is closed, the engine told to ``abort``, and nothing more is emitted), a failed
stream ended with a typed error, and the counters the runtime reports.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import structlog

from shared.errors import InternalError, InvalidRequest, ServiceError
from shared.messages import AllBlocksCleared, AnyKvEvent, BlockStored
from shared.tasks import TaskSet
from shared.worker.engine import EmissionSink
from shared.worker.records import (
    Emission,
    EngineError,
    EngineFacts,
    EngineInput,
    EngineLoad,
    EngineStats,
)

log = structlog.get_logger(__name__)

__all__ = ["StreamingEngine"]


@dataclass(slots=True, eq=False)
class _Running:
    request: EngineInput
    emitted: int = 0
    """Tokens emitted for choice 0 (a cancel's emission starts there)."""
    first_sent: bool = False
    task: asyncio.Task[None] | None = None
    cancelled: bool = False
    done: bool = False


class StreamingEngine(ABC):
    """Per-request streams behind ``WorkerEngine`` (see the module docstring)."""

    def __init__(self) -> None:
        self.stats = EngineStats()
        self.kv_events: list[AnyKvEvent] = []
        """KV events with JetServe hashes; an engine adds them with ``add_kv_events``."""
        self._kv_wake: Callable[[], None] | None = None
        self._pending: list[_Running] = []
        self._running: dict[str, _Running] = {}
        self._changed = asyncio.Event()
        self._tasks = TaskSet()
        self._dirty: dict[str, None] = {}
        """Requests with tokens buffered since the last flush (insertion-ordered)."""
        self._flusher: asyncio.Task[None] | None = None

    # --- what a subclass provides ---------------------------------------------------------------

    @abstractmethod
    async def start(self) -> EngineFacts: ...

    @abstractmethod
    def stream(self, request: EngineInput) -> AsyncIterator[Emission]:
        """The request's emissions in order; the last one has ``done``. Raise ``EngineError``
        for a request the engine refuses (answered as a 400)."""

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a request inside the engine (its stream is already closed)."""

    def check(self, request: EngineInput) -> None:  # noqa: B027 (optional hook)
        """Refuse at once what can never run (``EngineError``); default: nothing."""

    def kv_usage(self) -> tuple[int, int]:
        """``(used, total)`` KV blocks; default: unknown (0, 0)."""
        return 0, 0

    async def stop(self) -> None:
        """Stop every driver; a subclass releases its engine after calling this."""
        for entry in list(self._running.values()):
            entry.cancelled = True
        await self._tasks.close()

    # --- WorkerEngine ---------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self._pending or self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._pending)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._running or any(
            p.request.request_id == request_id for p in self._pending
        )

    def add(self, request: EngineInput) -> None:
        self.check(request)
        self._pending.append(_Running(request))
        self.stats.prompt_tokens += len(request.token_ids)
        self._changed.set()

    def cancel(self, request_id: str) -> Emission | None:
        entry = self._running.pop(request_id, None)
        if entry is None:
            for i, pending in enumerate(self._pending):
                if pending.request.request_id == request_id:
                    entry = self._pending.pop(i)
                    break
        if entry is None or entry.done:
            return None
        entry.cancelled = True
        if entry.task is not None:
            entry.task.cancel()
        self._changed.set()
        return Emission(
            request_id=request_id,
            token_ids=(),
            index=entry.emitted,
            finish_reason="cancelled",
            prompt_tokens=len(entry.request.token_ids),
            done=True,
        )

    def cancel_all(self) -> list[Emission]:
        ids = [p.request.request_id for p in self._pending] + list(self._running)
        return [e for rid in ids if (e := self.cancel(rid)) is not None]

    def reset_cache(self) -> None:
        """Engines start with an empty cache: say so, so routers drop a past life's blocks."""
        self.kv_events.append(AllBlocksCleared())

    def add_kv_events(self, events: Iterable[AnyKvEvent]) -> None:
        """New KV events (from the engine or its relay): kept for ``take_kv_events``, and the
        runtime woken to take them even when no request is running."""
        self.kv_events.extend(events)
        if self._kv_wake is not None and self.kv_events:
            self._kv_wake()

    def on_kv_events(self, wake: Callable[[], None]) -> None:
        self._kv_wake = wake

    def take_kv_events(self) -> list[AnyKvEvent]:
        events, self.kv_events = self.kv_events, []
        return events

    def kv_dump(self, *, with_tokens: bool) -> list[BlockStored]:
        return []

    def release_kv(self, request_id: str) -> bool:
        """No pinned blocks by default (vLLM's KV connector frees a prefill's blocks itself)."""
        return False

    def load(self) -> EngineLoad:
        used, total = self.kv_usage()
        waiting = len(self._pending)
        prefill = sum(len(p.request.token_ids) for p in self._pending)
        prefill += sum(len(r.request.token_ids) for r in self._running.values() if not r.first_sent)
        return EngineLoad(
            active=len(self._running),
            waiting=waiting,
            kv_used_blocks=used,
            kv_total_blocks=total,
            prefill_tokens=prefill,
        )

    async def run(self, sink: EmissionSink) -> None:
        while self._pending or self._running:
            self._changed.clear()
            while self._pending:
                entry = self._pending.pop(0)
                rid = entry.request.request_id
                self._running[rid] = entry
                entry.task = self._tasks.spawn(self._drive(entry, sink), name=f"stream-{rid}")
            if self._running:
                await self._changed.wait()

    # --- one request ----------------------------------------------------------------------------

    async def _drive(self, entry: _Running, sink: EmissionSink) -> None:
        rid = entry.request.request_id
        failure: ServiceError | None = None
        stream = self.stream(entry.request)
        try:
            async for emission in stream:
                if entry.cancelled:
                    break
                self._account(entry, emission)
                if sink.add(emission):  # a first token or a finish: out at once
                    await sink.flush([rid])
                    await sink.phases([emission])
                    await sink.progress()
                else:
                    self._flush_soon(rid, sink)
                if emission.done:
                    break
        except asyncio.CancelledError:
            pass
        except EngineError as exc:
            failure = InvalidRequest(str(exc))
        except Exception as exc:  # an engine's boundary: log once, end the request typed
            log.exception("engine_request_failed", request_id=rid)
            failure = InternalError(f"the engine failed: {type(exc).__name__}")
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]
            if entry.cancelled or failure is not None or not entry.done:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.abort(rid))
            self._running.pop(rid, None)
            self._changed.set()
        if failure is not None and not entry.cancelled:
            await sink.fail(rid, failure)
        elif not entry.done and not entry.cancelled:
            await sink.fail(rid, InternalError("the engine ended the request without finishing it"))
        await sink.flush([rid])

    def _flush_soon(self, request_id: str, sink: EmissionSink) -> None:
        """Publish ``request_id``'s buffered tokens once the drivers woken with it have added
        theirs: an engine step's outputs for every request go out in one flush."""
        self._dirty[request_id] = None
        if self._flusher is None:
            self._flusher = self._tasks.spawn(self._flush_dirty(sink), name="stream-flush")

    async def _flush_dirty(self, sink: EmissionSink) -> None:
        await asyncio.sleep(0)  # the other drivers of this step run first
        self._flusher = None
        ids, self._dirty = list(self._dirty), {}
        await sink.flush(ids)
        await sink.progress()

    def _account(self, entry: _Running, emission: Emission) -> None:
        if emission.token_ids and not entry.first_sent:
            entry.first_sent = True
            self.stats.cache_hit_tokens += emission.cached_tokens
        if emission.choice == 0:
            entry.emitted = emission.index + len(emission.token_ids)
        if emission.done:
            entry.done = True
