"""``VllmEngine``: JetServe's worker contract in front of an in-process vLLM ``AsyncLLM``.

The engine object is injected (``load`` returns a ``VllmHandle``; ``loader.load_vllm`` builds a
real one, ``tests/fakes/vllm_fakes.py`` a fake), so nothing here imports vllm. It follows
``AsyncLLM`` (``vllm/v1/engine/async_llm.py``): ``generate(prompt, sampling_params, request_id,
*, lora_request=...)`` is an async generator of ``RequestOutput``s; with
``RequestOutputKind.DELTA`` each carries only new tokens; closing it (or ``abort(request_id)``)
stops the request. The prompt is a ``TokensPrompt`` (``vllm/inputs/data.py``: a dict with
``prompt_token_ids`` and an optional ``cache_salt``), so vLLM never tokenizes.

KV events come from vLLM's ZMQ publisher through ``KvEventSubscriber`` and ``KvRelay`` into
``self.kv_events``, one feed per data-parallel rank (``kv_feeds``). Load comes from vLLM's
scheduler stats when the handle has them.

Data parallelism: with ``dp_size`` > 1 each request goes to its rank,
``generate(..., data_parallel_rank=EngineInput.dp_rank)`` (``AsyncLLM.generate``, read at commit
00080ee13c7a451fce071ccb8d0e94d395acf5a7; vLLM refuses a rank out of range, and so does
``check``). Disaggregated serving: a prefill or decode phase carries vLLM's proxy's
``kv_transfer_params`` in ``SamplingParams.extra_args`` (``sampling``); a prefill's last
``RequestOutput.kv_transfer_params`` (``vllm/outputs.py``: on the finished output, from the KV
connector's ``request_finished``; None when the prefill did not end at its token limit, e.g. on
EOS) becomes its last ``Emission.kv_transfer_params``. The KV connector frees a prefill's blocks
itself (NIXL: when the decode side has read them, else after ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``),
so ``release_kv`` keeps ``StreamingEngine``'s answer: nothing pinned here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import structlog

from services.vllm_worker.adapters import InProcessAdapters, LoraClient
from services.vllm_worker.kv_endpoints import KvSource
from services.vllm_worker.kv_feeds import FedEngine, KvFeeds
from services.vllm_worker.outputs import ChoiceDelta, DeltaTracker, logprobs_from_engine
from services.vllm_worker.prompt import pil_image, tokens_prompt
from services.vllm_worker.sampling import ALL_FEATURES, VllmFeatures, cache_salt, engine_kwargs
from services.vllm_worker.stats import SchedulerSnapshot
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
    @property
    def kv_transfer_params(self) -> dict[str, Any] | list[dict[str, Any]] | None: ...


class AsyncLLMLike(Protocol):
    """The part of ``vllm.v1.engine.async_llm.AsyncLLM`` the worker drives."""

    def generate(
        self,
        prompt: Any,
        sampling_params: Any,
        request_id: str,
        *,
        lora_request: Any = None,
        data_parallel_rank: int | None = None,
    ) -> AsyncIterator[RequestOutputLike]: ...

    async def abort(self, request_id: str | Iterable[str]) -> None: ...


@dataclass(slots=True, kw_only=True)
class VllmHandle:
    """A started engine and what the worker needs around it (built by ``loader``)."""

    client: AsyncLLMLike
    facts: EngineFacts
    make_sampling_params: Callable[[dict[str, Any]], Any]
    """``sampling.engine_kwargs`` → a ``vllm.SamplingParams`` (may raise ``ValueError``)."""
    make_lora: Callable[..., Any] | None = None
    """``vllm.lora.request.LoRARequest`` (keyword arguments ``lora_name``, ``lora_int_id``,
    ``lora_path``) when the engine runs with ``enable_lora``; None: it serves no adapters."""
    max_loras: int = 0
    kv_sources: tuple[KvSource, ...] = ()
    """Where each data-parallel rank publishes KV events (empty: no KV events)."""
    dp_size: int = 1
    """Data-parallel ranks of the engine (``AsyncEngineArgs.data_parallel_size``)."""
    scheduler: SchedulerSnapshot | None = None
    """Filled by the engine's stat logger, if it has one."""
    shutdown: Callable[[], Awaitable[None]] | None = None
    features: VllmFeatures = ALL_FEATURES
    """What the installed vLLM can do for agent requests (``loader.features``)."""


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


def transfer_params(output: RequestOutputLike) -> dict[str, Any] | None:
    """A ``RequestOutput``'s ``kv_transfer_params`` (a list of one with vLLM's per-choice
    params, one choice being all a disaggregated phase runs)."""
    params = getattr(output, "kv_transfer_params", None)
    if isinstance(params, list):
        params = params[0] if len(params) == 1 else None
    return dict(params) if isinstance(params, dict) and params else None


def check_request(request: EngineInput, context_length: int, dp_size: int = 1) -> None:
    """What neither vLLM engine can ever run (``EngineError``); ``context_length`` 0 = unknown."""
    if not 0 <= request.dp_rank < dp_size:
        raise EngineError(
            f"data-parallel rank {request.dp_rank} is out of range: the engine has {dp_size}"
        )
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


class VllmEngine(FedEngine, StreamingEngine):
    """One in-process vLLM engine behind one worker id."""

    def __init__(self, load: Callable[[], Awaitable[VllmHandle]]) -> None:
        super().__init__()
        self._load = load
        self._handle: VllmHandle | None = None
        self._facts: EngineFacts | None = None
        self.feeds: KvFeeds | None = None
        self._lora: InProcessAdapters | None = None

    # --- LoRA adapters (shared.worker.engine.AdapterEngine; services/vllm_worker/adapters.py) -
    def _adapters(self) -> InProcessAdapters:
        if self._lora is None:
            handle = self.handle
            client = cast(LoraClient, handle.client)
            self._lora = InProcessAdapters(client, handle.make_lora, handle.max_loras)
        return self._lora

    async def load_lora(self, name: str, path: str) -> None:
        await self._adapters().load_lora(name, path)

    async def unload_lora(self, name: str) -> None:
        await self._adapters().unload_lora(name)

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
        if handle.kv_sources:
            self.feeds = KvFeeds(
                handle.kv_sources, block_size=facts.block_size, on_events=self._on_kv_events
            )
            await self.feeds.start()
        else:
            facts = dataclasses.replace(facts, kv_events=False)
        log.info(
            "vllm_engine_started",
            block_size=facts.block_size,
            kv_blocks=facts.kv_blocks,
            dp_size=handle.dp_size,
        )
        self._facts = facts
        return facts

    def _on_kv_events(self, events: list[AnyKvEvent]) -> None:
        self.add_kv_events(events)

    async def stop(self) -> None:
        await super().stop()
        if self.feeds is not None:
            await self.feeds.stop()  # the relays still name what vLLM last reported
        if self._handle is not None and self._handle.shutdown is not None:
            await self._handle.shutdown()

    def check(self, request: EngineInput) -> None:
        handle = self.handle
        check_request(request, handle.facts.context_length, handle.dp_size)
        # raises EngineError for what vLLM cannot do
        engine_kwargs(
            request.sampling,
            phase=request.phase,
            kv_transfer=request.kv_transfer_params,
            features=handle.features,
        )
        if request.lora_name:
            self._adapters().request_for(request.lora_name)  # EngineError: not held here

    def kv_dump(self, *, with_tokens: bool) -> list[BlockStored]:
        """The blocks vLLM reported and has not evicted, every rank's (none without KV
        events)."""
        return self.feeds.dump(with_tokens=with_tokens) if self.feeds is not None else []

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
        kwargs = engine_kwargs(
            sampling,
            phase=request.phase,
            kv_transfer=request.kv_transfer_params,
            features=handle.features,
        )
        try:
            params = handle.make_sampling_params(kwargs)
        except EngineError:
            raise
        except (ValueError, TypeError) as exc:  # vLLM's own validation
            raise EngineError(str(exc)) from exc
        salt = cache_salt(request.hash_seed, salted_seed(lora_name=request.lora_name))
        prompt = tokens_prompt(request, salt=salt, load_image=pil_image)  # images: decision 032
        if self.feeds is not None:
            self.feeds.hint(request)
        lora = self._adapters().request_for(request.lora_name) if request.lora_name else None
        tracker = DeltaTracker(
            request.request_id,
            n=sampling.n,
            prompt_tokens=len(request.token_ids),
            resumed_tokens=request.resumed_tokens,
        )
        extra: dict[str, Any] = {}
        if handle.dp_size > 1:
            extra["data_parallel_rank"] = request.dp_rank
        outputs = handle.client.generate(
            prompt, params, request.request_id, lora_request=lora, **extra
        )
        prefilled: dict[str, Any] | None = None
        try:
            async for output in outputs:
                if request.phase == "prefill":
                    prefilled = transfer_params(output) or prefilled
                for emission in tracker.emissions(
                    deltas(output, sampling.logprobs),
                    finished=output.finished,
                    cached_tokens=output.num_cached_tokens or 0,
                ):
                    if emission.done and prefilled is not None:
                        emission = dataclasses.replace(emission, kv_transfer_params=prefilled)
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
