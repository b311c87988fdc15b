"""``HfEngine``: transformers' continuous batching (paged KV cache, real forward passes) behind
the streaming worker contract (``shared.worker.streaming.StreamingEngine``).

The model and its manager live in an ``EngineCore`` (``core``). By default that core runs in a
process of its own (``ProcessCore``: ``python -m services.hf_worker.core_process``, one socket
pair, ``core_wire`` frames), as vLLM's engine core does, so the worker's event loop never waits
on the GIL the forward passes and the manager's Python hold: on a GPU the two in one process
added 3 to 6 ms to TTFT at c=1. ``LocalCore`` runs it in threads of this process (the GPU
benchmark's "engine alone", and tests).

Each request is one ``CoreAdd``; the core sends each step's new tokens (``CoreOutputs``), which
land in the request's ``asyncio.Queue``; its ``stream`` merges what queued up and turns it into
``Emission``s (``outputs.RequestCursor``). A cancelled request is ``CoreCancel``-ed; outputs for a
request no longer here are dropped (``dropped_outputs``, the core's count and ours).

An engine process that exits while the worker runs fails every request it held
(``EngineFailed``) and calls ``on_core_exit``: the worker service passes one that ends the worker
process, so its requests migrate through the lost-worker path (decision 017) and the launcher
restarts it, as vLLM's server goes down with its engine core.

Sampling is mapped by ``sampling.cb_request`` (what cannot be honoured is a 400); guided
decoding travels as a ``GrammarSpec`` in ``CoreAdd`` to the core's ``Grammars`` (decision 028).
Images and LoRA adapters are a 400 here. KV events:
none (``EngineFacts.kv_events=False``): the paged cache's block tables are internal, so routers
of an hf worker use approximate mode. ``kv_usage`` estimates used blocks from the running
sequences' lengths. ``cached_tokens`` is not reported (0). Tested against transformers 5.17 and
5.24.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import structlog

from services.hf_worker.core import EngineCore
from services.hf_worker.core_wire import (
    HEADER,
    MAX_FRAME,
    CoreAdd,
    CoreCancel,
    CoreFacts,
    CoreOutput,
    CoreOutputs,
    CoreReady,
    CoreStartFailed,
    CoreStop,
    ToCore,
    decode_from_core,
    encode_options,
    frame,
)
from services.hf_worker.options import HfEngineOptions
from services.hf_worker.outputs import RequestCursor, blocks_in_use, merged
from services.hf_worker.sampling import cb_request
from shared.worker.records import Emission, EngineError, EngineFacts, EngineInput
from shared.worker.streaming import StreamingEngine

log = structlog.get_logger(__name__)

__all__ = ["HfEngine", "HfEngineOptions", "LocalCore", "ProcessCore"]

START_TIMEOUT_S = 600.0
"""Loading a model and building its cache; longer is a start-up failure."""
STOP_TIMEOUT_S = 20.0
"""How long a stopping engine process gets before it is killed."""

OutputsHandler = Callable[[CoreOutputs], None]
ExitHandler = Callable[[str], None]


class Core(Protocol):
    """Where the ``EngineCore`` runs, seen from the worker's event loop."""

    async def start(self, on_outputs: OutputsHandler, on_exit: ExitHandler) -> CoreFacts: ...

    def send(self, message: CoreAdd | CoreCancel) -> None: ...

    async def stop(self) -> None: ...


class LocalCore:
    """The core in threads of this process; outputs reach the loop by ``call_soon_threadsafe``."""

    def __init__(self, options: HfEngineOptions) -> None:
        self._options = options
        self._core: EngineCore | None = None

    async def start(self, on_outputs: OutputsHandler, on_exit: ExitHandler) -> CoreFacts:
        loop = asyncio.get_running_loop()

        def deliver(outputs: CoreOutputs) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: we are shutting down
                loop.call_soon_threadsafe(on_outputs, outputs)

        def died() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(on_exit, "transformers' generation loop stopped")

        self._core = EngineCore(self._options, deliver, on_died=died)
        return await asyncio.to_thread(self._core.start)

    def send(self, message: CoreAdd | CoreCancel) -> None:
        core = self._core
        if core is None:
            return
        if isinstance(message, CoreCancel):
            core.cancel(message.request_id)
        elif not core.add(message):
            raise RuntimeError("transformers' manager is not accepting requests")

    async def stop(self) -> None:
        core, self._core = self._core, None
        if core is not None:
            await asyncio.to_thread(core.stop)


class ProcessCore:
    """The core in ``python -m services.hf_worker.core_process`` over a socket pair."""

    def __init__(self, options: HfEngineOptions) -> None:
        self._options = options
        self.process: subprocess.Popen[bytes] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self, on_outputs: OutputsHandler, on_exit: ExitHandler) -> CoreFacts:
        ours, theirs = socket.socketpair()
        with theirs:
            command = [sys.executable, "-m", "services.hf_worker.core_process"]
            command += ["--fd", str(theirs.fileno()), "--options", encode_options(self._options)]
            self.process = await asyncio.to_thread(
                subprocess.Popen, command, pass_fds=(theirs.fileno(),)
            )
        reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        try:
            first = await asyncio.wait_for(_read(reader), timeout=START_TIMEOUT_S)
        except TimeoutError:
            await self.stop()
            raise RuntimeError(
                f"the engine process did not start in {START_TIMEOUT_S:.0f}s"
            ) from None
        if not isinstance(first, CoreReady):
            code = await asyncio.to_thread(self._wait, STOP_TIMEOUT_S)
            await self.stop()
            why = first.error if isinstance(first, CoreStartFailed) else f"exit code {code}"
            raise RuntimeError(f"the engine process failed to start: {why}")
        self._reader_task = asyncio.create_task(
            self._read_outputs(reader, on_outputs, on_exit), name="hf-core-outputs"
        )
        log.info("hf_engine_process_started", pid=self.process.pid)
        return first.facts

    async def _read_outputs(
        self, reader: asyncio.StreamReader, on_outputs: OutputsHandler, on_exit: ExitHandler
    ) -> None:
        while (message := await _read(reader)) is not None:
            if isinstance(message, CoreOutputs):
                on_outputs(message)
        if not self._stopping:
            code = await asyncio.to_thread(self._wait, STOP_TIMEOUT_S)
            on_exit(f"the engine process exited (code {code})")

    def send(self, message: CoreAdd | CoreCancel) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            raise RuntimeError("the engine process is not running")
        writer.write(frame(message))

    async def stop(self) -> None:
        self._stopping = True
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(OSError, RuntimeError):
                stop: ToCore = CoreStop()
                writer.write(frame(stop))
                await asyncio.wait_for(writer.drain(), timeout=STOP_TIMEOUT_S)
        if self.process is not None and self.process.poll() is None:
            await asyncio.to_thread(self._wait, STOP_TIMEOUT_S)
            if self.process.poll() is None:
                log.warning("hf_engine_process_killed", pid=self.process.pid)
                self.process.kill()
                await asyncio.to_thread(self.process.wait)
        if writer is not None:
            writer.close()
        if self._reader_task is not None:
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await self._reader_task

    def _wait(self, timeout_s: float) -> int | None:
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout_s)
        return None


async def _read(reader: asyncio.StreamReader) -> CoreReady | CoreStartFailed | CoreOutputs | None:
    """The engine process's next message (None: its end closed)."""
    try:
        head = await reader.readexactly(HEADER.size)
        (size,) = HEADER.unpack(head)
        if size > MAX_FRAME:
            raise ConnectionError(f"a {size}-byte frame from the engine process")
        return decode_from_core(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class HfEngine(StreamingEngine):
    """One transformers model behind the worker contract (see the module docstring)."""

    def __init__(
        self, options: HfEngineOptions, *, on_core_exit: Callable[[str], None] | None = None
    ) -> None:
        super().__init__()
        self.options = options
        self.core: Core = ProcessCore(options) if options.own_process else LocalCore(options)
        self._on_core_exit = on_core_exit
        self._core_facts: CoreFacts | None = None
        self._facts: EngineFacts | None = None
        self._queues: dict[str, asyncio.Queue[CoreOutput]] = {}
        self._lengths: dict[str, int] = {}
        """Tokens (prompt + generated) of each running request, for ``kv_usage``."""
        self._dropped_here = 0
        self._dropped_by_core = 0
        self.core_exited: str | None = None
        """Why the engine process is gone (None: it runs, or never ran)."""

    @property
    def dropped_outputs(self) -> int:
        """Outputs for requests no longer here (a cancelled one's last steps in flight)."""
        return self._dropped_here + self._dropped_by_core

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> EngineFacts:
        opts = self.options
        facts = await self.core.start(self._deliver, self._core_gone)
        self._core_facts = facts
        self._facts = EngineFacts(
            kind="hf",
            block_size=opts.block_size,
            kv_blocks=facts.kv_blocks,
            max_num_seqs=opts.max_num_seqs,
            context_length=facts.context_length,
            kv_events=False,
        )
        log.info(
            "hf_engine_started",
            device=facts.device,
            dtype=facts.dtype,
            kv_blocks=facts.kv_blocks,
            block_size=opts.block_size,
            context_length=facts.context_length,
            own_process=opts.own_process,
        )
        return self._facts

    async def stop(self) -> None:
        await super().stop()
        await self.core.stop()
        self._core_facts = None

    # --- the core's outputs ---------------------------------------------------------------------

    def _deliver(self, batch: CoreOutputs) -> None:
        self._dropped_by_core = batch.dropped
        for output in batch.outputs:
            queue = self._queues.get(output.request_id)
            if queue is not None:
                queue.put_nowait(output)
            else:
                self._dropped_here += 1

    def _core_gone(self, why: str) -> None:
        """The engine process exited on its own: fail what it held, then tell the worker."""
        self.core_exited = why
        log.error("hf_engine_process_exited", why=why, requests=len(self._queues))
        for rid, queue in self._queues.items():
            failed = CoreOutput(request_id=rid, new_tokens=(), total=0, status=4, error=why)
            queue.put_nowait(failed)
        if self._on_core_exit is not None:
            self._on_core_exit(why)

    # --- StreamingEngine --------------------------------------------------------------------------

    def check(self, request: EngineInput) -> None:
        if not request.token_ids:
            raise EngineError("the prompt must contain at least one token")
        if self._core_facts is None or self._facts is None:
            raise EngineError("the hf engine has not started")
        if request.images:
            raise EngineError("the hf engine does not take images (serve a vision model on vLLM)")
        if request.lora_name:
            raise EngineError("the hf engine does not load LoRA adapters (serve them on vLLM)")
        sampling = cb_request(request.sampling, self._core_facts.vocab_size)
        if sampling.grammar is not None and not self._core_facts.guided:
            raise EngineError("guided decoding needs xgrammar: pip install 'jetserve[hf]'")
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
        facts = self._core_facts
        if facts is None or self.core_exited is not None:
            raise RuntimeError(self.core_exited or "the hf engine is not running")
        args = cb_request(request.sampling, facts.vocab_size)
        rid = request.request_id
        queue: asyncio.Queue[CoreOutput] = asyncio.Queue()
        self._queues[rid] = queue
        self._lengths[rid] = len(request.token_ids)
        cursor = RequestCursor(
            request_id=rid,
            prompt_tokens=len(request.token_ids),
            max_tokens=args.max_new_tokens,
            stop_ids=frozenset(args.eos_token_ids),
        )
        try:
            self.core.send(
                CoreAdd(
                    request_id=rid,
                    token_ids=request.token_ids,
                    max_new_tokens=args.max_new_tokens,
                    eos_token_ids=args.eos_token_ids,
                    temperature=args.temperature,
                    top_k=args.top_k,
                    top_p=args.top_p,
                    grammar=args.grammar,
                    resumed=request.token_ids[-request.resumed_tokens :]
                    if args.grammar is not None and request.resumed_tokens
                    else (),
                )
            )
            while not cursor.done:
                emission = cursor.advance(await _next(queue))
                self._lengths[rid] = len(request.token_ids) + cursor.emitted
                if emission is not None:
                    yield emission
        finally:
            self._queues.pop(rid, None)
            self._lengths.pop(rid, None)

    async def abort(self, request_id: str) -> None:
        self._queues.pop(request_id, None)
        self._lengths.pop(request_id, None)
        with contextlib.suppress(RuntimeError):  # the engine process is gone: nothing to stop
            self.core.send(CoreCancel(request_id=request_id))

    def kv_usage(self) -> tuple[int, int]:
        if self._facts is None:
            return 0, 0
        used = blocks_in_use(self._lengths.values(), self._facts.block_size)
        return min(used, self._facts.kv_blocks), self._facts.kv_blocks


async def _next(queue: asyncio.Queue[CoreOutput]) -> CoreOutput:
    """The request's next output, merged with any that queued up behind it."""
    output = await queue.get()
    while not queue.empty():
        output = merged(output, queue.get_nowait())
    return output
