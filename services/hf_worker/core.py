"""``EngineCore``: one transformers model and its continuous-batching manager, with no event loop.

It is what runs in the engine process (``services.hf_worker.core_process``), as vLLM's
``EngineCore`` does behind its ``AsyncLLM``: the model is loaded, the manager started, and one
dispatcher thread drains the manager's output queue. The manager reports a streaming request's
state cumulatively (``generated_tokens`` is everything so far); the dispatcher turns that into
deltas (``CoreOutput``: the new tokens, the total) so a long answer crosses the process boundary
once, and hands each step's batch to ``on_outputs`` as one ``CoreOutputs``. Outputs for a request
no longer here (a cancelled one's last steps in flight) are not sent but counted: the batch
carries the running count (``dropped``), so a caller can tell the manager stopped a request.

With xgrammar installed the core attaches its ``grammar.Grammars`` processor to the manager
before it starts (decision 028): a ``CoreAdd`` with a ``GrammarSpec`` gets a matcher, which is
dropped when the request ends.

``add`` and ``cancel`` are called from any thread (the process's socket reader); the manager's
own queue takes them. Blocking calls: run it where blocking is fine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from services.hf_worker.core_wire import CoreAdd, CoreFacts, CoreOutput, CoreOutputs
from services.hf_worker.grammar import Grammars
from services.hf_worker.model import LoadedModel, cb_sizes, load_model
from services.hf_worker.options import HfEngineOptions
from services.hf_worker.sampling import PROCESSOR_DEFAULTS
from shared.worker.records import EngineError

log = structlog.get_logger(__name__)

__all__ = ["EngineCore"]

_POLL_S = 0.1
_START_TIMEOUT_S = 600.0

OutputsSink = Callable[[CoreOutputs], None]
"""Called by the dispatcher thread with one step's outputs (in the order the manager gave them)."""


class EngineCore:
    """The model and its manager (see the module docstring)."""

    def __init__(
        self,
        options: HfEngineOptions,
        on_outputs: OutputsSink,
        on_died: Callable[[], None] | None = None,
    ) -> None:
        self.options = options
        self._on_outputs = on_outputs
        self._on_died = on_died
        self.died = False
        """The manager's generation loop stopped while nobody was stopping it."""
        self._manager: Any = None
        self.grammars: Grammars | None = None
        self._sent: dict[str, int] = {}
        """Tokens already handed out, per running request (under ``_lock``)."""
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._dispatcher: threading.Thread | None = None
        self.dropped = 0

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> CoreFacts:
        """Load the model, start the manager and the dispatcher; what the engine is (blocking)."""
        opts = self.options
        loaded = load_model(
            opts.model_dir,
            random_weights=opts.random_weights,
            device=opts.device,
            dtype=opts.dtype,
            seed=opts.seed,
        )
        self._manager, self.grammars = _start_manager(opts, loaded)
        kv_blocks = _wait_for_cache(self._manager, opts.num_blocks)
        self._dispatcher = threading.Thread(target=self._dispatch, name="hf-dispatch", daemon=True)
        self._dispatcher.start()
        return CoreFacts(
            device=loaded.device,
            dtype=loaded.dtype,
            vocab_size=loaded.vocab_size,
            context_length=opts.context_length or loaded.context_length or 4096,
            kv_blocks=kv_blocks,
            guided=self.grammars is not None,
        )

    def stop(self) -> None:
        self._halt.set()
        manager, self._manager = self._manager, None
        if manager is not None:
            # Requests were drained or cancelled by then: a hard stop fails any it still holds.
            with contextlib.suppress(Exception):  # a manager that failed to start warns, returns
                manager.stop(block=True, timeout=10.0, hard_stop=True)
        if self._dispatcher is not None:
            self._dispatcher.join(5.0)

    @property
    def running(self) -> bool:
        return self._manager is not None and bool(self._manager.is_running())

    # --- requests ---------------------------------------------------------------------------------

    def add(self, request: CoreAdd) -> bool:
        """Queue ``request`` in the manager; False when it is not accepting requests.
        ``EngineError`` when its grammar cannot be had (none attached, or it does not compile)."""
        manager = self._manager
        if manager is None:
            return False
        if request.grammar is not None:
            if self.grammars is None:
                raise EngineError("guided decoding needs xgrammar: pip install 'jetserve[hf]'")
            self.grammars.add(request.request_id, request.grammar, request.resumed)
        with self._lock:
            self._sent[request.request_id] = 0
        accepted = manager.add_request(
            list(request.token_ids),
            request_id=request.request_id,
            max_new_tokens=request.max_new_tokens,
            streaming=True,
            eos_token_id=list(request.eos_token_ids),
            temperature=request.temperature,
            top_k=request.top_k,
            top_p=request.top_p,
        )
        if accepted is None:
            with self._lock:
                self._sent.pop(request.request_id, None)
            self._forget(request.request_id)
            return False
        return True

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._sent.pop(request_id, None)
        self._forget(request_id)
        manager = self._manager
        if manager is not None:
            manager.cancel_request(request_id)

    # --- the manager's outputs --------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Dispatcher thread: drain the manager's output queue, one ``on_outputs`` per batch."""
        manager = self._manager
        while not self._halt.is_set():
            first = manager.get_result(timeout=_POLL_S)
            if first is None:
                if not manager.is_running() and not self._halt.is_set():
                    self.died = True
                    log.error("hf_generation_loop_stopped")
                    if self._on_died is not None:
                        self._on_died()
                    return
                continue
            results = [first]
            while (more := manager.get_result(timeout=0)) is not None:
                results.append(more)
            dropped = self.dropped
            batch = [o for o in map(self._delta, results) if o is not None]
            if batch or self.dropped != dropped:
                self._on_outputs(CoreOutputs(outputs=batch, dropped=self.dropped))

    def _delta(self, result: Any) -> CoreOutput | None:
        """The tokens of ``result`` not handed out yet (None: a request no longer here)."""
        rid = result.request_id
        generated = result.generated_tokens
        status = int(result.status)
        with self._lock:
            sent = self._sent.get(rid)
            if sent is None:
                self.dropped += 1
                return None
            new = tuple(generated[sent:])
            finished = status >= 3 or result.error is not None
            if finished:
                del self._sent[rid]
            else:
                self._sent[rid] = len(generated)
        if finished:
            self._forget(rid)
        return CoreOutput(
            request_id=rid, new_tokens=new, total=len(generated), status=status, error=result.error
        )

    def _forget(self, request_id: str) -> None:
        if self.grammars is not None:
            self.grammars.discard(request_id)


def _start_manager(opts: HfEngineOptions, loaded: LoadedModel) -> tuple[Any, Grammars | None]:
    """Build and start the manager, with the grammars' processor when xgrammar is installed
    (attached before the start: decision 028) (blocking)."""
    torch = importlib.import_module("torch")
    GenerationConfig = importlib.import_module("transformers").GenerationConfig
    ContinuousBatchingConfig = importlib.import_module(
        "transformers.generation.configuration_utils"
    ).ContinuousBatchingConfig

    num_blocks, max_batch_tokens = cb_sizes(loaded.device, opts.num_blocks, opts.max_batch_tokens)
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
        grammars = _grammars(opts, loaded)
        if grammars is not None:
            grammars.attach(manager)
        manager.start()
    return manager, grammars


def _grammars(opts: HfEngineOptions, loaded: LoadedModel) -> Grammars | None:
    """The engine's grammars; None (guided requests are then a 400) without xgrammar."""
    try:
        return Grammars.from_model_dir(opts.model_dir, vocab_size=loaded.vocab_size)
    except ImportError as exc:  # xgrammar, or one of its own dependencies, is missing
        log.warning("hf_guided_decoding_off", why=f"{type(exc).__name__}: {exc}")
        return None


def _wait_for_cache(manager: Any, configured_blocks: int) -> int:
    """The cache's size in blocks once the manager's thread has built it (blocking)."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    while getattr(manager, "batch_processor", None) is None:
        if not manager.is_running() or time.monotonic() > deadline:
            raise RuntimeError("transformers' continuous batching did not start (see its log)")
        time.sleep(0.02)
    cache = getattr(manager.batch_processor, "cache", None)
    blocks = getattr(cache, "num_blocks", None)
    return int(blocks) if isinstance(blocks, int) else configured_blocks
