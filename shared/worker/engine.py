"""The contract between the worker runtime and an engine (mocker, vLLM, transformers).

The runtime (``shared.worker.runtime``) owns everything engine-independent: the registry card
and heartbeat, the ``generate``/``cancel``/``ping`` subscriptions, admission checks, token
batching (``Outbox``), bounces and formatter graces, drain, KV event numbering and publishing,
load reports. An engine only runs requests: it takes ``EngineInput``s, produces ``Emission``s,
and reports its load, counters and KV events. No engine imports another; each engine package
imports this contract and nothing of the runtime's wiring.

Two ways to drive an engine, both behind ``WorkerEngine.run``:

- stepped (the mocker): ``run`` steps a pure scheduler and hands each step's emissions to the
  sink, pacing itself (``services.mocker.pacing``);
- streaming (vLLM, a remote vLLM, transformers): each request streams its own deltas; the
  ``StreamingEngine`` base (``shared.worker.streaming``) runs one task per request and ``run``
  waits until none is left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from shared.errors import ServiceError
from shared.messages import AnyKvEvent, BlockStored
from shared.worker.records import Emission, EngineFacts, EngineInput, EngineLoad, EngineStats

__all__ = ["AdapterEngine", "EmissionSink", "WorkerEngine"]


class EmissionSink(Protocol):
    """What an engine's ``run`` hands its output to (implemented by the runtime)."""

    def add(self, emission: Emission) -> bool:
        """Buffer ``emission`` in the request's outbox; True when it should go out at once (a
        first token or a finish)."""
        ...

    async def flush(self, request_ids: Sequence[str] | None = None) -> None:
        """Publish what is buffered for ``request_ids`` (None: every request with tokens)."""
        ...

    async def phases(self, emissions: Sequence[Emission]) -> None:
        """Tell routers ``prefill_done`` (a first token) and ``finished`` (a last emission)."""
        ...

    async def fail(self, request_id: str, error: ServiceError) -> None:
        """End a request with a typed error on its stream (what it emitted so far stays)."""
        ...

    def collect(self) -> None:
        """Take the engine's new KV events (cheap: a background task stores them)."""
        ...

    async def progress(self) -> None:
        """``collect``, then report the engine's load (rate-limited)."""
        ...

    async def kv_pulled(self, request_id: str, pulled_blocks: int) -> None:
        """Disaggregated decode: the blocks ``EngineInput.kv_transfer_params`` named are here
        (``pulled_blocks`` of them moved; the rest were already cached). The runtime tells the
        prefill worker to unpin them (``KvRelease``), once per request: a request that ends
        without this call is released when it ends. An engine whose KV connector frees the
        source itself (vLLM) need not call it."""
        ...


class WorkerEngine(Protocol):
    """One engine instance behind one worker id (one GPU, or one remote engine)."""

    stats: EngineStats

    async def start(self) -> EngineFacts:
        """Load or connect; return the facts for the worker card."""
        ...

    async def stop(self) -> None:
        """Release the engine (called after the runtime has drained or cancelled its requests)."""
        ...

    @property
    def has_work(self) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    def __contains__(self, request_id: str) -> bool: ...

    def add(self, request: EngineInput) -> None:
        """Queue a request; raise ``EngineError`` (a typed 400) for one it can never run."""
        ...

    def cancel(self, request_id: str) -> Emission | None:
        """Stop a request; its last emission (``finish_reason="cancelled"``, ``done``), or None if
        it is not here."""
        ...

    def cancel_all(self) -> list[Emission]:
        """Stop every request (shutdown past its grace, or an engine failure)."""
        ...

    def reset_cache(self) -> None:
        """Drop the prefix cache at start; the next KV event is ``AllBlocksCleared``."""
        ...

    def take_kv_events(self) -> list[AnyKvEvent]:
        """KV events since the last call, in order, with JetServe's block hashes."""
        ...

    def on_kv_events(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever KV events arrive outside ``run`` (an engine whose events come
        from a feed of their own, such as vLLM's ZMQ publisher, after its last request ended);
        the runtime then takes them. An engine whose events only come from ``run`` ignores it."""
        ...

    def release_kv(self, request_id: str) -> bool:
        """Disaggregated prefill: unpin the blocks a prefill phase of ``request_id`` kept for
        its decode worker (pulled, cancelled); True if there were any. An engine whose KV
        connector frees them itself (vLLM) returns False."""
        ...

    def kv_dump(self, *, with_tokens: bool) -> list[BlockStored]:
        """Every cached block as ``BlockStored`` events (a router's resync); may be empty for an
        engine that cannot list its cache (its routers then rely on the event stream)."""
        ...

    def load(self) -> EngineLoad: ...

    async def run(self, sink: EmissionSink) -> None:
        """Run until no request is left, handing every emission to ``sink``."""
        ...


@runtime_checkable
class AdapterEngine(Protocol):
    """An engine that serves LoRA adapters (the mocker, vLLM). The runtime keeps which adapters
    the worker holds (its card) and calls these; an engine without them serves none, and a
    worker given ``--lora-modules`` over it stops at start saying so (decision 031)."""

    async def load_lora(self, name: str, path: str) -> None:
        """Hold adapter ``name`` from ``path`` (vLLM: ``add_lora``, which pre-loads it);
        raise ``EngineError`` when it cannot be loaded (no such adapter, a bad rank)."""
        ...

    async def unload_lora(self, name: str) -> None:
        """Stop holding ``name`` (vLLM: ``remove_lora``); requests running on it finish."""
        ...
