"""``VllmEngine``: JetServe's worker contract in front of an in-process vLLM ``AsyncLLM``.

The engine object is injected (``load`` returns a ``VllmHandle``; ``loader.load_vllm`` builds a
real one, ``tests/fakes/vllm_fakes.py`` a fake), so nothing here imports vllm. It follows
``AsyncLLM`` (``vllm/v1/engine/async_llm.py``): ``generate(prompt, sampling_params, request_id,
*, lora_request=...)`` is an async generator of ``RequestOutput``s; with
``RequestOutputKind.DELTA`` each carries only new tokens; closing it (or ``abort(request_id)``)
stops the request. The prompt is a ``TokensPrompt`` (``vllm/inputs/data.py``: a dict with
``prompt_token_ids`` and an optional ``cache_salt``), so vLLM never tokenizes.

KV events come from vLLM's ZMQ publisher through ``KvEventSubscriber`` and ``KvRelay`` into
``self.kv_events``. Load comes from vLLM's scheduler stats when the handle has them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from services.vllm_worker.kv_relay import KvRelay
from services.vllm_worker.outputs import ChoiceDelta, DeltaTracker, logprobs_from_engine
from services.vllm_worker.sampling import cache_salt, engine_kwargs
from services.vllm_worker.stats import SchedulerSnapshot
from services.vllm_worker.zmq_events import KvEventSubscriber
from shared.hashing import salted_seed
from shared.messages import AnyKvEvent, BlockStored
from shared.worker.records import Emission, EngineError, EngineFacts, EngineInput, EngineLoad
from shared.worker.streaming import StreamingEngine

log = structlog.get_logger(__name__)

__all__ = [
    "AsyncLLMLike",
    "CompletionOutputLike",
    "RequestOutputLike",
    "VllmEngine",
    "VllmHandle",
]


class CompletionOutputLike(Protocol):
    """``vllm.outputs.CompletionOutput``: what one choice produced (a delta, with DELTA)."""

    @property
    def index(self) -> int: ...
    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def stop_reason(self) -> int | str | None: ...
    @property
    def logprobs(self) -> Sequence[Mapping[int, Any] | None] | None: ...


class RequestOutputLike(Protocol):
    """``vllm.outputs.RequestOutput``."""

    @property
    def request_id(self) -> str: ...
    @property
    def prompt_token_ids(self) -> Sequence[int] | None: ...
    @property
    def outputs(self) -> Sequence[CompletionOutputLike]: ...
    @property
    def finished(self) -> bool: ...
    @property
    def num_cached_tokens(self) -> int | None: ...


class AsyncLLMLike(Protocol):
    """The part of ``vllm.v1.engine.async_llm.AsyncLLM`` the worker drives."""

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *, lora_request: Any = None
    ) -> AsyncIterator[RequestOutputLike]: ...

    async def abort(self, request_id: str | Iterable[str]) -> None: ...


@dataclass(slots=True, kw_only=True)
class VllmHandle:
    """A started engine and what the worker needs around it (built by ``loader``)."""

    client: AsyncLLMLike
    facts: EngineFacts
    make_sampling_params: Callable[[dict[str, Any]], Any]
    """``sampling.engine_kwargs`` → a ``vllm.SamplingParams`` (may raise ``ValueError``)."""
    make_lora: Callable[[str], Any] | None = None
    """A LoRA name → a ``LoRARequest`` (None: the engine serves no adapters)."""
    kv_endpoint: str | None = None
    """The ZMQ PUB endpoint vLLM publishes KV events on (None: no KV events)."""
    kv_replay_endpoint: str | None = None
    kv_topic: str = ""
    scheduler: SchedulerSnapshot | None = None
    """Filled by the engine's stat logger, if it has one."""
    shutdown: Callable[[], Awaitable[None]] | None = None


def deltas(output: RequestOutputLike, logprobs: int | None) -> list[ChoiceDelta]:
    """A ``RequestOutput``'s choices as ``ChoiceDelta``s."""
    out = []
    for completion in output.outputs:
        ids = tuple(int(t) for t in completion.token_ids)
        out.append(
            ChoiceDelta(
                choice=completion.index,
                token_ids=ids,
                finish_reason=completion.finish_reason,
                stop_reason=completion.stop_reason,
                logprobs=(
                    logprobs_from_engine(ids, completion.logprobs, logprobs)
                    if logprobs is not None
                    else ()
                ),
            )
        )
    return out


def check_request(request: EngineInput, context_length: int) -> None:
    """What neither vLLM engine can ever run (``EngineError``); ``context_length`` 0 = unknown."""
    if context_length and len(request.token_ids) >= context_length:
        raise EngineError(
            f"the prompt has {len(request.token_ids)} tokens; the model's context is "
            f"{context_length}"
        )
    if not request.token_ids:
        raise EngineError("the prompt must contain at least one token")
    if not 0 <= request.resumed_tokens < len(request.token_ids):
        raise EngineError("resumed_tokens must be below the prompt length")
    if request.resumed_tokens and request.sampling.n > 1:
        raise EngineError("a request with n > 1 cannot be resumed")


class VllmEngine(StreamingEngine):
    """One in-process vLLM engine behind one worker id."""

    def __init__(self, load: Callable[[], Awaitable[VllmHandle]]) -> None:
        super().__init__()
        self._load = load
        self._handle: VllmHandle | None = None
        self._facts: EngineFacts | None = None
        self.relay: KvRelay | None = None
        self.subscriber: KvEventSubscriber | None = None

    @property
    def handle(self) -> VllmHandle:
        if self._handle is None:
            raise RuntimeError("the vLLM engine has not started")
        return self._handle

    async def start(self) -> EngineFacts:
        """Load the engine and start following its KV events (once: a started engine returns
        its facts again)."""
        if self._facts is not None:
            return self._facts
        handle = self._handle = await self._load()
        facts = handle.facts
        if handle.kv_endpoint is not None:
            self.relay = KvRelay(block_size=facts.block_size)
            self.subscriber = KvEventSubscriber(
                self.relay,
                handle.kv_endpoint,
                self._on_kv_events,
                replay_endpoint=handle.kv_replay_endpoint,
                topic=handle.kv_topic,
            )
            await self.subscriber.start()
        else:
            facts = dataclasses.replace(facts, kv_events=False)
        log.info("vllm_engine_started", block_size=facts.block_size, kv_blocks=facts.kv_blocks)
        self._facts = facts
        return facts

    def _on_kv_events(self, events: list[AnyKvEvent]) -> None:
        self.add_kv_events(events)

    async def stop(self) -> None:
        await super().stop()
        if self.subscriber is not None:
            await self.subscriber.stop()
            self.subscriber = None
        if self._handle is not None and self._handle.shutdown is not None:
            await self._handle.shutdown()

    def check(self, request: EngineInput) -> None:
        check_request(request, self.handle.facts.context_length)
        engine_kwargs(request.sampling)  # raises EngineError for what vLLM cannot do
        if request.lora_name and self.handle.make_lora is None:
            raise EngineError(f"LoRA adapter {request.lora_name!r} is not served by this worker")

    def kv_dump(self, *, with_tokens: bool) -> list[BlockStored]:
        """The blocks vLLM reported and has not evicted (none without KV events)."""
        return self.relay.dump(with_tokens=with_tokens) if self.relay is not None else []

    def kv_usage(self) -> tuple[int, int]:
        total = self.handle.facts.kv_blocks if self._handle is not None else 0
        snapshot = self._handle.scheduler if self._handle is not None else None
        if snapshot is None or not snapshot.seen:
            return 0, total
        return snapshot.used_blocks(total), total

    def load(self) -> EngineLoad:
        """The base's counts, split as vLLM's scheduler last saw them: of the requests this
        engine streams, those vLLM has not scheduled yet count as waiting (the engine is this
        worker's alone, so its stats never show more than ours)."""
        base = super().load()
        snapshot = self._handle.scheduler if self._handle is not None else None
        if snapshot is None or not snapshot.seen:
            return base
        running = min(snapshot.running, base.active)
        return EngineLoad(
            active=running,
            waiting=base.waiting + base.active - running,
            kv_used_blocks=base.kv_used_blocks,
            kv_total_blocks=base.kv_total_blocks,
            prefill_tokens=base.prefill_tokens,
        )

    async def abort(self, request_id: str) -> None:
        await self.handle.client.abort(request_id)

    async def stream(self, request: EngineInput) -> AsyncIterator[Emission]:
        handle = self.handle
        sampling = request.sampling
        try:
            params = handle.make_sampling_params(engine_kwargs(sampling))
        except EngineError:
            raise
        except (ValueError, TypeError) as exc:  # vLLM's own validation
            raise EngineError(str(exc)) from exc
        prompt: dict[str, Any] = {"prompt_token_ids": list(request.token_ids)}
        salt = cache_salt(request.hash_seed, salted_seed(lora_name=request.lora_name))
        if salt is not None:
            prompt["cache_salt"] = salt
        if self.relay is not None:
            self.relay.hint(request.token_ids, request.lora_name, request.hash_seed)
        lora = None
        if request.lora_name:
            if handle.make_lora is None:
                raise EngineError(f"LoRA adapter {request.lora_name!r} is not served")
            lora = handle.make_lora(request.lora_name)
        tracker = DeltaTracker(
            request.request_id,
            n=sampling.n,
            prompt_tokens=len(request.token_ids),
            resumed_tokens=request.resumed_tokens,
        )
        outputs = handle.client.generate(prompt, params, request.request_id, lora_request=lora)
        try:
            async for output in outputs:
                for emission in tracker.emissions(
                    deltas(output, sampling.logprobs),
                    finished=output.finished,
                    cached_tokens=output.num_cached_tokens or 0,
                ):
                    yield emission
                if tracker.done:
                    return
        except EngineError:
            raise
        except ValueError as exc:  # a request vLLM refuses (too long, bad parameters)
            raise EngineError(str(exc)) from exc
        finally:
            aclose = getattr(outputs, "aclose", None)
            if aclose is not None:
                await aclose()
