"""``HfEngine``: transformers' continuous batching (paged KV cache, real forward passes) behind
the streaming worker contract (``shared.worker.streaming.StreamingEngine``).

One ``ContinuousBatchingManager`` per engine runs its generation loop in its own thread. Every
request is added with ``streaming=True``; the manager puts a ``GenerationOutput`` (cumulative
tokens) on its output queue after each step. One dispatcher thread of ours drains that queue with
the public ``get_result`` and hands each step's outputs to the event loop in one
``call_soon_threadsafe``; there each request's ``asyncio.Queue`` gets its output, and the
request's ``stream`` turns it into an ``Emission`` (``outputs.RequestCursor``). A cancelled
request is ``cancel_request``-ed; outputs for a request no longer here are dropped.

Sampling is mapped by ``sampling.cb_request`` (what cannot be honoured is a 400). KV events:
none (``EngineFacts.kv_events=False``). The paged cache's block tables are internal and changed
shape between transformers 5.17 and 5.24 (``cache_manager`` vs ``cache_allocators``), so
routers of an hf worker use approximate mode. ``kv_usage`` estimates used blocks from the
running sequences' lengths. ``cached_tokens`` is not reported (0): the manager does not say how
much of a prompt its block sharing reused. Tested against transformers 5.17 and 5.24.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import importlib.util
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from services.hf_worker.model import LoadedModel, cb_sizes, load_model
from services.hf_worker.outputs import OutputView, RequestCursor, blocks_in_use, view
from services.hf_worker.sampling import PROCESSOR_DEFAULTS, cb_request
from shared.worker.records import Emission, EngineError, EngineFacts, EngineInput
from shared.worker.streaming import StreamingEngine

log = structlog.get_logger(__name__)

__all__ = ["HfEngine", "HfEngineOptions"]

_POLL_S = 0.1
_START_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class HfEngineOptions:
    """What one engine needs (``HfWorkerConfig`` makes one per worker)."""

    model_dir: Path
    random_weights: bool = False
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 64
    """The paged cache's page size in tokens (transformers' ``page_size``/``block_size``)."""
    num_blocks: int = 0
    """KV blocks (0: transformers sizes the cache from free GPU memory)."""
    max_batch_tokens: int = 0
    """Tokens per forward pass (0: transformers decides)."""
    max_num_seqs: int = 64
    """Requests per forward pass (``max_requests_per_batch``)."""
    context_length: int = 0
    """0: the model's ``max_position_embeddings``."""
    seed: int = 0
    """Random weights and the manager's sampling generator."""
    prefix_sharing: bool = True
    """transformers' block sharing (prefix caching) inside the engine."""


class HfEngine(StreamingEngine):
    """One transformers model and its continuous-batching manager (see the module docstring)."""

    def __init__(self, options: HfEngineOptions) -> None:
        super().__init__()
        self.options = options
        self.loaded: LoadedModel | None = None
        self._manager: Any = None
        self._facts: EngineFacts | None = None
        self._queues: dict[str, asyncio.Queue[OutputView]] = {}
        self._lengths: dict[str, int] = {}
        """Tokens (prompt + generated) of each running request, for ``kv_usage``."""
        self._dispatcher: threading.Thread | None = None
        self._halt = threading.Event()
        self.dropped_outputs = 0
        """Outputs for requests no longer here (a cancelled one's last steps in flight)."""

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> EngineFacts:
        opts = self.options
        loop = asyncio.get_running_loop()
        self.loaded = await asyncio.to_thread(
            load_model,
            opts.model_dir,
            random_weights=opts.random_weights,
            device=opts.device,
            dtype=opts.dtype,
            seed=opts.seed,
        )
        self._manager = await asyncio.to_thread(self._start_manager, self.loaded)
        kv_blocks = await self._wait_for_cache()
        self._dispatcher = threading.Thread(
            target=self._dispatch, args=(loop,), name="hf-dispatch", daemon=True
        )
        self._dispatcher.start()
        context = opts.context_length or self.loaded.context_length or 4096
        self._facts = EngineFacts(
            kind="hf",
            block_size=opts.block_size,
            kv_blocks=kv_blocks,
            max_num_seqs=opts.max_num_seqs,
            context_length=context,
            kv_events=False,
        )
        log.info(
            "hf_engine_started",
            device=self.loaded.device,
            dtype=self.loaded.dtype,
            kv_blocks=kv_blocks,
            block_size=opts.block_size,
            context_length=context,
        )
        return self._facts

    def _start_manager(self, loaded: LoadedModel) -> Any:
        """Build and start the manager (blocking; in a worker thread)."""
        torch = importlib.import_module("torch")
        GenerationConfig = importlib.import_module("transformers").GenerationConfig
        ContinuousBatchingConfig = importlib.import_module(
            "transformers.generation.configuration_utils"
        ).ContinuousBatchingConfig

        opts = self.options
        num_blocks, max_batch_tokens = cb_sizes(
            loaded.device, opts.num_blocks, opts.max_batch_tokens
        )
        names = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
        kwargs: dict[str, Any] = {
            "num_blocks": num_blocks,
            "max_batch_tokens": max_batch_tokens,
            "max_requests_per_batch": opts.max_num_seqs,
            "per_request_processors": True,
            "allow_block_sharing": opts.prefix_sharing,
            "seed": opts.seed,
        }
        # 5.17 names the page size block_size; later versions page_size (block_size deprecated).
        kwargs["page_size" if "page_size" in names else "block_size"] = opts.block_size
        # Flash attention only where the flash_attn package is installed: transformers' probe
        # would otherwise try its hub ``kernels`` fallback, which an offline machine cannot load.
        flash = loaded.device == "cuda" and importlib.util.find_spec("flash_attn") is not None
        if "auto_switch_to_flash" in names:
            kwargs["auto_switch_to_flash"] = flash
        elif not flash:  # 5.17 has no switch: a paged implementation already skips its probe
            current = str(loaded.model.config._attn_implementation or "sdpa")
            if "paged|" not in current:
                loaded.model.set_attn_implementation(f"paged|{current}")
        generation = GenerationConfig(
            do_sample=True, max_new_tokens=16, eos_token_id=-1, **PROCESSOR_DEFAULTS
        )
        with torch.inference_mode():
            manager = loaded.model.init_continuous_batching(
                generation_config=generation,
                continuous_batching_config=ContinuousBatchingConfig(**kwargs),
            )
            manager.start()
        return manager

    async def _wait_for_cache(self) -> int:
        """The cache's size in blocks once the manager's thread has built it."""
        manager = self._manager
        deadline = time.monotonic() + _START_TIMEOUT_S
        while getattr(manager, "batch_processor", None) is None:
            if not manager.is_running() or time.monotonic() > deadline:
                raise RuntimeError("transformers' continuous batching did not start (see its log)")
            await asyncio.sleep(0.02)
        cache = getattr(manager.batch_processor, "cache", None)
        blocks = getattr(cache, "num_blocks", None)
        return int(blocks) if isinstance(blocks, int) else self.options.num_blocks

    async def stop(self) -> None:
        await super().stop()
        self._halt.set()
        manager, self._manager = self._manager, None
        if manager is not None:
            await asyncio.to_thread(_stop_manager, manager)
        if self._dispatcher is not None:
            await asyncio.to_thread(self._dispatcher.join, 5.0)
        self.loaded = None

    # --- the manager's outputs ------------------------------------------------------------------

    def _dispatch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Dispatcher thread: drain the manager's output queue, one hop to the loop per batch."""
        manager = self._manager
        while not self._halt.is_set():
            first = manager.get_result(timeout=_POLL_S)
            if first is None:
                if not manager.is_running():
                    time.sleep(_POLL_S)  # get_result returns at once when the loop is gone
                continue
            batch = [(first.request_id, _view(first))]
            while (more := manager.get_result(timeout=0)) is not None:
                batch.append((more.request_id, _view(more)))
            with contextlib.suppress(RuntimeError):  # the loop is closed: we are shutting down
                loop.call_soon_threadsafe(self._deliver, batch)

    def _deliver(self, batch: list[tuple[str, OutputView]]) -> None:
        for request_id, output in batch:
            queue = self._queues.get(request_id)
            if queue is not None:
                queue.put_nowait(output)
            else:
                self.dropped_outputs += 1

    # --- StreamingEngine --------------------------------------------------------------------------

    def check(self, request: EngineInput) -> None:
        if not request.token_ids:
            raise EngineError("the prompt must contain at least one token")
        if self.loaded is None or self._facts is None:
            raise EngineError("the hf engine has not started")
        sampling = cb_request(request.sampling, self.loaded.vocab_size)
        total = len(request.token_ids) + sampling.max_new_tokens
        if total > self._facts.context_length:
            raise EngineError(
                f"the prompt ({len(request.token_ids)} tokens) plus max_tokens "
                f"({sampling.max_new_tokens}) is over the context length "
                f"({self._facts.context_length})"
            )
        if self._facts.kv_blocks and blocks_in_use([total], self._facts.block_size) > (
            self._facts.kv_blocks
        ):
            raise EngineError("the request does not fit in the KV cache")

    async def stream(self, request: EngineInput) -> AsyncIterator[Emission]:
        manager, loaded = self._manager, self.loaded
        if manager is None or loaded is None:
            raise RuntimeError("the hf engine is not running")
        args = cb_request(request.sampling, loaded.vocab_size)
        rid = request.request_id
        queue: asyncio.Queue[OutputView] = asyncio.Queue()
        self._queues[rid] = queue
        self._lengths[rid] = len(request.token_ids)
        cursor = RequestCursor(
            request_id=rid,
            prompt_tokens=len(request.token_ids),
            max_tokens=args.max_new_tokens,
            stop_ids=frozenset(args.eos_token_ids),
        )
        try:
            accepted = manager.add_request(
                list(request.token_ids),
                request_id=rid,
                max_new_tokens=args.max_new_tokens,
                streaming=True,
                eos_token_id=list(args.eos_token_ids),
                **args.processor_kwargs(),
            )
            if accepted is None:
                raise RuntimeError("transformers' manager is not accepting requests")
            while not cursor.done:
                output = await self._next(queue)
                emission = cursor.advance(output)
                self._lengths[rid] = len(request.token_ids) + cursor.emitted
                if emission is not None:
                    yield emission
        finally:
            self._queues.pop(rid, None)
            self._lengths.pop(rid, None)

    async def _next(self, queue: asyncio.Queue[OutputView]) -> OutputView:
        """The newest output of a request (outputs are cumulative: older queued ones are
        skipped); RuntimeError if the manager's loop died meanwhile."""
        while True:
            try:
                output = await asyncio.wait_for(queue.get(), timeout=1.0)
            except TimeoutError:
                manager = self._manager
                if manager is None or not manager.is_running():
                    raise RuntimeError("transformers' generation loop stopped") from None
                continue
            while not queue.empty():
                newer = queue.get_nowait()
                if newer.error is not None or len(newer.generated) >= len(output.generated):
                    output = newer
            return output

    async def abort(self, request_id: str) -> None:
        self._queues.pop(request_id, None)
        self._lengths.pop(request_id, None)
        if self._manager is not None:
            self._manager.cancel_request(request_id)

    def kv_usage(self) -> tuple[int, int]:
        if self._facts is None:
            return 0, 0
        used = blocks_in_use(self._lengths.values(), self._facts.block_size)
        return min(used, self._facts.kv_blocks), self._facts.kv_blocks


def _view(output: Any) -> OutputView:
    return view(output.generated_tokens, output.status, output.error)


def _stop_manager(manager: Any) -> None:
    # Requests were drained or cancelled by then: a hard stop fails any the manager still holds.
    with contextlib.suppress(Exception):  # a manager that failed to start warns and returns
        manager.stop(block=True, timeout=10.0, hard_stop=True)
