"""One worker, whatever its engine: ``generate``/``cancel`` subscriptions → engine → token batches.

The runtime owns what every engine needs (``shared.worker.engine`` is the contract): the registry
card and heartbeat, admission checks, the engine loop (``WorkerEngine.run`` until idle, with this
runtime as its ``EmissionSink``), token batching (``Outbox``), lifecycle phases, KV events and
load (``WorkerPublisher``), cancellation and drain. The handlers sit on the shared boundary
(``shared.handlers``): a rejected request is answered on its stream and its slot freed (phase
``finished``) there.

Liveness (decisions 017, 018): ``ping`` answers routers' empty probes until the very end of a
drain, and a formatter's ``WorkerPing`` with whether this worker holds that attempt of the
request. Token batches go out with a bounce subject: a bounce starts a grace
(``grace.FORMATTER_GRACE_S``) during which the request keeps generating, since its formatter
may be moving to another NATS node; then the formatter is pinged, and if it does not answer the
request is cancelled (if still here) and its gateway told (``FormatterLost``).

Disaggregated serving (``shared.worker.handoff``): a prefill phase (``Generate.prefill_to``)
answers its router (``PrefillResult`` or ``RequestFailed``) instead of streaming, and its pinned
blocks are released by the decode worker's ``KvRelease`` (``kv_release`` subject), a broadcast
``Cancel`` or the engine's pin timeout; a decode phase (``Generate.kv_transfer``) streams with
the prefill worker named on its batches and releases the source's blocks once, when pulled or
when it ends. ``Generate.dp_rank`` picks the engine's data-parallel rank. A request that is
neither (rank 0) takes the same path as before: each addition costs it one dict check.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import bound_contextvars

from shared import codec
from shared.bounce import Unreachable
from shared.bus import drain_subscription
from shared.errors import (
    ContextLengthExceeded,
    FormatterLost,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    ServiceError,
    ShuttingDown,
    WorkerBusy,
)
from shared.handlers import Boundary
from shared.hashing import salted_seed
from shared.messages import (
    Cancel,
    Generate,
    KvRelease,
    LoraCommand,
    TokenBatch,
    WorkerCard,
    WorkerPing,
    WorkerRole,
)
from shared.pings import answer_ping
from shared.recent import RecentIds
from shared.subjects import Subjects
from shared.tasks import TaskSet
from shared.worker.adapters import LORA_COMMANDS, WorkerAdapters
from shared.worker.canary import EngineWatch
from shared.worker.config import WorkerConfig
from shared.worker.engine import WorkerEngine
from shared.worker.grace import FORMATTER_GRACE_S, FormatterGrace, Grace
from shared.worker.handoff import PREFILL_CANCELLED, Handoffs, RequestCancelled
from shared.worker.health import HealthSettings, parse_payload
from shared.worker.metrics import WorkerMetrics
from shared.worker.outbox import Outbox
from shared.worker.presence import WorkerPresence
from shared.worker.publisher import WorkerPublisher
from shared.worker.records import Emission, EngineError, EngineInput
from shared.worker.speculative import Speculation

log = structlog.get_logger(__name__)

FORMATTER_PING_TIMEOUT_S = 0.5
"""At the end of a grace: a formatter that does not answer within this is gone (or hung)."""
WITHDRAW_AFTER_S = 1.0
"""An unhealthy engine's worker leaves the registry this long after it stops answering probes:
routers with requests on it probe every 0.25 s and check "no responders" again 0.3 s later
(decision 018) before they publish ``WorkerLost``; a slower router leaves those requests to
the formatters' stall check (2 s without a batch, then ``WorkerPing``: no responders)."""


def _reply_to(gen: Generate) -> str:
    """Where a rejected request's failure goes: its router for a prefill phase, else its
    stream."""
    return gen.prefill_to or gen.stream_to


class WorkerRuntime:
    """One worker: its subscriptions, its engine loop and its registry card."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        config: WorkerConfig,
        engine: WorkerEngine,
        worker_id: str,
        metrics: WorkerMetrics,
    ) -> None:
        self.worker_id = worker_id
        self._nc = nc
        self._subjects = subjects
        self._config = config
        self._boundary = Boundary(nc, metrics.service)
        self.engine = engine
        self.context_length = 0
        self.block_size = 0
        """The engine's KV block size, known once ``prepare`` has run."""
        """The engine's context length (known once started)."""
        self.publisher = WorkerPublisher(
            nc,
            subjects,
            worker_id,
            self.engine,
            metrics,
            kv_stream_limits=(config.kv_stream_max_age_s, config.kv_stream_max_bytes),
            replicas=config.js_replicas,
        )
        self._outbox = Outbox(worker_id)
        self._handoffs = Handoffs(worker_id)
        self._prefills = self._handoffs.prefills
        """Prefill phases running here (``Handoffs.prefills``)."""
        self._unreachable = Unreachable(nc, subjects, self._on_bounce, instance_id=worker_id)
        self._grace = FormatterGrace()
        """Requests whose batches bounced, waiting out their formatter's move (decision 018)."""
        self._grace_tasks = TaskSet()
        """One timer task per request in ``_grace``."""
        self._early_cancels = RecentIds(ttl_s=60.0)
        """Cancels for requests not (yet) here: a Generate that arrives after its cancel."""
        self._speculation = Speculation()
        """Turns that asked to warm their session's next turn, and those warm-ups running."""
        self.adapters = WorkerAdapters(
            worker_id, config.model_name, engine, config.max_loras, self._put_card
        )
        """The LoRA adapters this worker holds (decision 031)."""
        self._presence = WorkerPresence(
            nc, subjects, ttl_s=config.worker_ttl_s, replicas=config.js_replicas
        )
        """The card (once prepared) and the subscriptions; ``subs[0]`` is ``generate``."""
        self._prepared = False
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._accepting = False
        self._loop_task: asyncio.Task[None] | None = None
        self._ping_sub: Subscription | None = None
        """None while the engine is unhealthy: routers' probes get "no responders"."""
        self._watch = EngineWatch(
            worker_id,
            HealthSettings(
                idle_s=config.health_check_idle_s,
                timeout_s=config.health_check_timeout_s,
                stall_s=config.engine_stall_s,
            ),
            parse_payload(config.health_check_payload),
            busy=lambda: self.engine.has_work,
            submit=self._submit_canary,
            on_unhealthy=self._engine_unhealthy,
            on_recovered=self._engine_recovered,
            metrics=metrics,
        )
        """The engine's canary and progress watchdog (``shared.worker.canary``, decision 029)."""

    async def prepare(self) -> None:
        """Start the engine (load weights, connect) and build the card from its facts."""
        if self._prepared:
            return
        facts = await self.engine.start()
        self.context_length = self._config.context_length or facts.context_length
        self.block_size = facts.block_size
        self._handoffs.pin_timeout_s = facts.kv_pin_timeout_s
        role: WorkerRole = self._config.role  # type: ignore[assignment]  # a checked choice
        card = WorkerCard(
            worker_id=self.worker_id,
            model=self._config.model_name,
            kind=facts.kind,
            block_size=facts.block_size,
            kv_blocks=facts.kv_blocks,
            max_num_seqs=facts.max_num_seqs,
            context_length=self.context_length,
            kv_events=facts.kv_events,
            role=role,
            dp_size=self._config.data_parallel_size,
        )
        await self.adapters.load_static(self._config.adapters())
        self._presence.add_card(self.adapters.on_card(card))
        self._prepared = True

    async def start(self) -> None:
        """Prepare, reset the cache, subscribe, start the loop, then register (the card means
        "ready")."""
        await self.prepare()
        self.engine.on_kv_events(self.publisher.collect_kv_events)
        self.engine.reset_cache()  # event 1 = AllBlocksCleared: routers drop a past life's blocks
        await self.publisher.start()
        self._accepting = True
        on_generate = self._boundary.handler(
            codec.decoder(Generate),
            "generate",
            self.on_generate,
            reply_to=_reply_to,
            after_failure=self._free_slot,
        )
        on_cancel = self._boundary.handler(codec.decoder(Cancel), "cancel", self.on_cancel)
        on_release = self._boundary.handler(
            codec.decoder(KvRelease), "kv_release", self.on_kv_release
        )
        await self._unreachable.start()
        # Tasks copy the context they start in: the subscriptions' (nats-py starts one per
        # subscription) and the engine loop's log lines carry the worker id.
        subscribe = self._presence.subscribe
        with bound_contextvars(worker_id=self.worker_id):
            await subscribe(self._subjects.generate(self.worker_id), on_generate)
            await subscribe(self._subjects.cancel, on_cancel)
            self._ping_sub = await subscribe(
                self._subjects.worker_ping(self.worker_id), self._on_ping
            )
            await subscribe(self._subjects.kv_release(self.worker_id), on_release)
            await subscribe(self._subjects.worker_lora(self.worker_id), self._on_lora)
            self._loop_task = asyncio.create_task(self._loop(), name=f"engine-{self.worker_id}")
        await self._presence.announce()  # subscribed on the server before the card says "ready"
        with bound_contextvars(worker_id=self.worker_id):
            self._watch.start()
        log.info("worker_started", worker_id=self.worker_id, model=self._config.model_name)

    async def stop(self, grace_s: float) -> None:
        """Leave the registry, stop taking work, finish in-flight work (bounded), then stop."""
        self._accepting = False
        await self._watch.stop()
        await self._presence.withdraw()
        subs = self._presence.subs
        if subs:  # drain: a Generate already delivered is answered (shutting_down)
            await drain_subscription(subs[0])
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=grace_s)
        except TimeoutError:
            cancelled = self.engine.cancel_all()
            log.warning(
                "requests_cancelled_on_shutdown", worker_id=self.worker_id, count=len(cancelled)
            )
            shutting_down = ShuttingDown(f"worker {self.worker_id} is shutting down")
            for emission in cancelled:
                if not self._handoffs.fail(emission.request_id, shutting_down):
                    self._outbox.add(emission)
            await self.phases(cancelled)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        await self._flush(self._outbox.dirty())
        await self._grace_tasks.close()
        self._grace.clear()
        for sub in subs[1:]:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await self._unreachable.stop()
        self.publisher.collect_kv_events()
        await self.publisher.stop()
        await self.engine.stop()
        log.info("worker_stopped", worker_id=self.worker_id)

    # --- handlers (on the shared boundary: decoded, request id bound, failures answered) ---------

    async def on_generate(self, gen: Generate) -> None:
        if self._early_cancels.pop(gen.request_id, time.monotonic()):
            await self._drop_cancelled(gen)
            return
        self._admit(gen)

    async def _free_slot(self, gen: Generate, _: ServiceError) -> None:
        """A rejected or failed request: routers free its slot; a decode phase never admitted
        releases its source's blocks."""
        await self._release_unadmitted(gen)
        await self.publisher.phase(gen.request_id, "finished", gen.dp_rank)

    async def _release_unadmitted(self, gen: Generate) -> None:
        """A decode phase that never ran here: its prefill worker may unpin the blocks."""
        if gen.kv_transfer is not None and gen.request_id not in self._handoffs.releases:
            source = gen.kv_transfer.source_worker_id
            await self._release(self._subjects.kv_release(source), gen.request_id)

    async def _drop_cancelled(self, gen: Generate) -> None:
        """The client gave up before this request reached us: end it without generating."""
        log.debug("request_cancelled", reason="cancelled_before_arrival")
        if gen.prefill_to:
            failure = RequestCancelled(PREFILL_CANCELLED)
            await self._nc.publish(gen.prefill_to, codec.encode(failure.to_message(gen.request_id)))
        else:
            await self._release_unadmitted(gen)
            ended = TokenBatch(
                request_id=gen.request_id,
                token_ids=(),
                finish_reason="cancelled",
                prompt_tokens=len(gen.token_ids),
                worker_id=self.worker_id,
            )
            await self._nc.publish(gen.stream_to, codec.encode(ended))
        await self.publisher.phase(gen.request_id, "finished", gen.dp_rank)  # frees its slot

    async def _release(self, subject: str, request_id: str, pulled_blocks: int = 0) -> None:
        """Tell a prefill worker to unpin a request's blocks (``KvRelease``)."""
        release = KvRelease(request_id=request_id, pulled_blocks=pulled_blocks)
        await self._nc.publish(subject, codec.encode(release))
        log.debug("kv_release_sent", request_id=request_id, pulled_blocks=pulled_blocks)

    def _admit(self, gen: Generate) -> None:
        if not self._accepting:
            raise ShuttingDown(f"worker {self.worker_id} is shutting down")
        if not self._watch.healthy:  # retryable: the formatter routes it elsewhere
            raise ShuttingDown(f"worker {self.worker_id}'s engine is unhealthy")
        if gen.model != self._config.model_name:
            raise ModelNotFound(gen.model)
        dp_rank = gen.dp_rank
        if dp_rank and not 0 <= dp_rank < self._config.data_parallel_size:
            raise InvalidRequest(
                f"dp_rank {dp_rank} is out of range: worker {self.worker_id} has "
                f"{self._config.data_parallel_size} data-parallel rank(s)",
                param="dp_rank",
            )
        if (
            gen.request_id in self.engine
            or gen.request_id in self._outbox
            or (self._prefills and gen.request_id in self._prefills)
        ):
            earlier = self._outbox.attempt(gen.request_id)
            if earlier is None:
                earlier = self._handoffs.attempt(gen.request_id)
            if earlier is None or gen.attempt <= earlier:
                log.warning("duplicate_request_ignored")
                return
            self.engine.cancel(gen.request_id)  # a migration came back here: the new one wins
            self._outbox.close(gen.request_id)
            self._handoffs.forget(gen.request_id)
        limit = self._config.max_waiting
        if limit and self.engine.num_waiting >= limit:
            raise WorkerBusy(f"worker {self.worker_id} has {limit} requests queued")
        prompt_tokens = len(gen.token_ids)
        requested = prompt_tokens + gen.sampling.max_tokens
        if requested > self.context_length:
            raise ContextLengthExceeded(
                limit=self.context_length, requested=requested, prompt_tokens=prompt_tokens
            )
        routing = gen.routing
        lora_name = routing.lora_name if routing else None
        self.adapters.check(lora_name)
        seed = salted_seed(lora_name=lora_name, cache_salt=routing.cache_salt if routing else None)
        transfer = gen.kv_transfer
        request = EngineInput(
            request_id=gen.request_id,
            token_ids=gen.token_ids,
            sampling=gen.sampling,
            hash_seed=seed,
            lora_name=lora_name,
            resumed_tokens=gen.resumed_tokens,
            dp_rank=dp_rank,
            phase="prefill" if gen.prefill_to else "decode" if transfer is not None else "both",
            kv_transfer_params=transfer.params if transfer is not None else None,
            images=gen.images,
        )
        try:
            self.engine.add(request)
        except EngineError as exc:
            raise InvalidRequest(str(exc)) from exc
        if gen.prefill_to:
            self._handoffs.open_prefill(gen)
        else:
            self._outbox.open(
                gen.request_id,
                gen.stream_to,
                prompt_tokens=prompt_tokens,
                cached_tokens=transfer.cached_tokens if transfer is not None else 0,
                attempt=gen.attempt,
                reply_to=gen.reply_to,
                n=gen.sampling.n,
                dp_rank=dp_rank,
                prefill_worker_id=transfer.source_worker_id if transfer is not None else "",
                prefill_dp_rank=transfer.source_dp_rank if transfer is not None else 0,
            )
            if transfer is not None:
                release = self._subjects.kv_release(transfer.source_worker_id)
                self._handoffs.releases[gen.request_id] = release
        if dp_rank:
            self._handoffs.ranks[gen.request_id] = dp_rank
        if routing is not None and routing.speculative_prefill:
            self._speculation.watch(gen, request)
        log.debug("request_received", prompt_tokens=prompt_tokens)
        self._idle.clear()
        self._wake.set()

    async def on_cancel(self, cancel: Cancel) -> None:
        if cancel.worker_id is not None and cancel.worker_id != self.worker_id:
            return  # another worker's attempt of a migrated request
        if self._grace:
            self._grace.forget(cancel.request_id)  # someone is there to cancel it
        if self.engine.release_kv(cancel.request_id):  # a prefill's blocks pinned here
            log.debug("kv_unpinned", reason="cancelled")
        emission = self.engine.cancel(cancel.request_id)
        if emission is not None:
            self.add(emission)
            log.debug("request_cancelled", reason=cancel.reason)
            await self._flush([cancel.request_id])
            await self.phases([emission])
        elif self._handoffs.fail(cancel.request_id, RequestCancelled(PREFILL_CANCELLED)):
            # A prefill phase whose last step is under way (its emission not handed over yet):
            # its router hears now; its phases go out with that emission.
            log.debug("request_cancelled", reason=cancel.reason)
            await self._flush(())
        else:
            # Not ours (cancel is a broadcast), finished, or still on its way to us.
            self._early_cancels.add(cancel.request_id, time.monotonic())
            return
        if not self.engine.has_work:
            self._idle.set()
            await self.publisher.report_load(is_idle=True)

    async def on_kv_release(self, release: KvRelease) -> None:
        """A decode worker pulled (or gave up on) a prefill's blocks: unpin them."""
        if self.engine.release_kv(release.request_id):
            log.debug("kv_unpinned", reason="released", pulled_blocks=release.pulled_blocks)
            await self.publisher.report_load(is_idle=not self.engine.has_work)

    # --- engine loop -----------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.engine.run(self)
                await self.flush()
            except Exception:
                log.exception("engine_loop_failed")
                await self._fail_all()
            if not self.engine.has_work:
                self._idle.set()
                self.publisher.idle()
                await self.publisher.report_load(is_idle=True)

    # --- EmissionSink: what the engine's run hands over ---------------------------------------

    def add(self, emission: Emission) -> bool:
        if emission.token_ids or emission.finish_reason != "cancelled":
            self._watch.progress += 1  # not a cancel's emission: the engine made progress
        if self._watch.owns(emission.request_id):
            self._watch.ended(emission)
            return False
        if self._speculation:
            self._speculation.add(emission)
        if self._prefills and emission.request_id in self._prefills:
            return self._handoffs.add(emission, time.time())  # answered on the next flush
        return self._outbox.add(emission)

    async def flush(self, request_ids: Sequence[str] | None = None) -> None:
        await self._flush(self._outbox.dirty() if request_ids is None else request_ids)

    async def fail(self, request_id: str, error: ServiceError) -> None:
        """End a request typed on its stream: what it emitted goes first, then the error (a
        prefill phase: the error goes to its router)."""
        if self._watch.owns(request_id):
            self._watch.failed(request_id, error.code)
            return
        if self._speculation:
            self._speculation.forget(request_id)
        if self._handoffs.fail(request_id, error):
            await self._flush(())
            log.warning("request_failed", request_id=request_id, code=error.code)
            await self._finished(request_id)
            return
        await self._flush([request_id])
        stream_to = self._outbox.stream_to(request_id)
        self._outbox.close(request_id)
        if stream_to is not None:
            await self._nc.publish(stream_to, codec.encode(error.to_message(request_id)))
        log.warning("request_failed", request_id=request_id, code=error.code)
        await self._finished(request_id)

    async def kv_pulled(self, request_id: str, pulled_blocks: int) -> None:
        """A decode phase's blocks are here: its prefill worker may unpin them."""
        self._watch.progress += 1
        subject = self._handoffs.pop_release(request_id)
        if subject is not None:
            await self._release(subject, request_id, pulled_blocks)

    def collect(self) -> None:
        self._watch.progress += 1
        self.publisher.collect_kv_events()

    async def progress(self) -> None:
        self._watch.progress += 1
        self.publisher.collect_kv_events()
        if self._watch.canary_id and not self._outbox and not self._prefills:
            return  # only the canary runs: it is never load to routers
        await self.publisher.report_load()

    async def phases(self, emissions: Sequence[Emission]) -> None:
        """``prefill_done`` with a request's first token, ``finished`` with its last batch (of
        its last choice)."""
        for e in emissions:
            if self._speculation and self._speculative(e):
                continue
            if self._watch.owns(e.request_id):  # the canary has no lifecycle
                self._watch.ended(e)
                continue
            if e.index == 0 and e.token_ids and e.choice == 0:
                rank = self._handoffs.rank(e.request_id)
                await self.publisher.phase(e.request_id, "prefill_done", rank)
            if e.done:
                await self._finished(e.request_id, e.index + len(e.token_ids))

    async def _finished(self, request_id: str, output_tokens: int = 0) -> None:
        """A request ended here: release its source's blocks if still owed, then routers free
        its slot (and charge its tenant ``output_tokens``: its last choice's count)."""
        subject = self._handoffs.pop_release(request_id)
        if subject is not None:
            await self._release(subject, request_id)
        rank = self._handoffs.pop_rank(request_id)
        await self.publisher.phase(request_id, "finished", rank, output_tokens=output_tokens)

    def _speculative(self, emission: Emission) -> bool:
        """True for a speculative prefill's emission (routers never counted it: no phases); a
        followed turn's last emission starts its speculative prefill (``speculative.py``)."""
        speculation = self._speculation
        if speculation.is_speculative(emission.request_id):
            if emission.done:
                speculation.ended(emission.request_id)
            return True
        if emission.done:
            warm = speculation.finished(emission, self.context_length)
            if warm is not None:
                self._start_speculative(warm)
        return False

    def _start_speculative(self, request: EngineInput) -> None:
        """Prefill a finished turn's prompt + answer here (replacing the session's last one)."""
        spec_id = request.request_id
        if not self._accepting or self._early_cancels.pop(spec_id, time.monotonic()):
            self._speculation.ended(spec_id)  # draining, or its next turn already went away
            return
        if spec_id in self.engine:
            self.engine.cancel(spec_id)
        try:
            self.engine.add(request)
        except EngineError as exc:
            self._speculation.ended(spec_id)
            log.debug("speculative_prefill_refused", request_id=spec_id, error=str(exc))
            return
        log.debug("speculative_prefill_started", request_id=spec_id, tokens=len(request.token_ids))
        self._idle.clear()
        self._wake.set()

    async def _flush(self, request_ids: Sequence[str]) -> None:
        if self._handoffs.ready:  # prefill phases' answers for their routers
            for subject, answer in self._handoffs.take_ready():
                await self._nc.publish(subject, codec.encode(answer))
                log.debug(
                    "prefill_answered", request_id=answer.request_id, kind=type(answer).__name__
                )
        for request_id in request_ids:
            while (taken := self._outbox.take(request_id)) is not None:  # one batch per choice
                stream_to, batch = taken
                reply = self._unreachable.reply_for(request_id)
                await self._nc.publish(stream_to, codec.encode(batch), reply=reply)
                if batch.finish_reason is not None:
                    log.debug(
                        "request_finished",
                        request_id=request_id,
                        worker_id=self.worker_id,
                        finish_reason=batch.finish_reason,
                        completion_tokens=batch.index + len(batch.token_ids),
                        choice=batch.choice,
                    )

    # --- engine health: the canary and the watchdog's verdicts (decision 029) --------------------

    def _submit_canary(self, request: EngineInput) -> None:
        """Hand the canary to the engine (``EngineError`` if refused) and wake the loop; not
        ``_idle``: a drain never waits for it."""
        stats = self.engine.stats
        before = stats.prompt_tokens
        self.engine.add(request)
        # no user's prompt: out of the prompt-token counter (engines count at ``add``)
        stats.prompt_tokens = max(before, stats.prompt_tokens - len(request.token_ids))
        self._wake.set()

    async def _engine_unhealthy(self, reason: str) -> None:
        """The engine missed a check: stop answering probes, so routers find this worker lost
        and name its requests in ``WorkerLost`` (formatters migrate them, decision 017); then
        leave the registry (a router drops a worker whose card is gone without probing it)."""
        sub, self._ping_sub = self._ping_sub, None
        if sub is not None:
            with contextlib.suppress(ValueError):
                self._presence.subs.remove(sub)
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        await asyncio.sleep(WITHDRAW_AFTER_S)  # meanwhile new requests are refused, retryable
        await self._presence.withdraw()
        log.warning("worker_withdrawn", worker_id=self.worker_id, reason=reason)

    async def _engine_recovered(self) -> None:
        """The engine finished a canary again: answer probes and register again (routers take
        back a lost worker whose card is newer than its loss)."""
        if not self._accepting or self._ping_sub is not None:
            return  # draining: stay out
        with bound_contextvars(worker_id=self.worker_id):
            self._ping_sub = await self._presence.subscribe(
                self._subjects.worker_ping(self.worker_id), self._on_ping
            )
        await self._presence.announce()
        log.info("worker_rejoined", worker_id=self.worker_id)

    # --- liveness: pings and bounces (decision 018) -----------------------------------------------

    async def _put_card(self, card: WorkerCard) -> None:
        await self._presence.update_card(card)

    async def _on_lora(self, msg: Msg) -> None:
        """``LoadLoraAdapter`` / ``UnloadLoraAdapter`` (``shared.worker.adapters``)."""
        try:
            command: LoraCommand = LORA_COMMANDS.decode(msg.data)
        except codec.DecodeError as exc:
            log.warning("bad_lora_command", error=str(exc))
            return
        answer = await self.adapters.handle(command, self._presence.card(self.worker_id))
        if msg.reply:
            with contextlib.suppress(nats.errors.Error):
                await msg.respond(codec.encode(answer))

    async def _on_ping(self, msg: Msg) -> None:
        """A router's probe or a formatter's ``WorkerPing`` (``shared.pings``)."""
        await answer_ping(msg, self._holds, on_undecodable=self._undecodable_ping)

    def _holds(self, ping: WorkerPing) -> bool:
        """``held``: this attempt of the request is here, queued, running or finishing (a
        decode phase also while it pulls its blocks; a prefill phase while it runs)."""
        if self._outbox.attempt(ping.request_id) == ping.attempt:
            return True
        return bool(self._prefills) and self._handoffs.attempt(ping.request_id) == ping.attempt

    def _undecodable_ping(self, exc: Exception) -> None:
        self._boundary.metrics.error("message_undecodable")
        log.warning("message_undecodable", kind="worker_ping", error=str(exc))

    async def _on_bounce(self, request_id: str, subject: str) -> None:
        """A batch bounced: its formatter is gone or moving; keep generating for a grace."""
        attempt = self._outbox.attempt(request_id)
        formatter_id = self._subjects.formatter_of(subject)
        if attempt is None or formatter_id is None:
            return  # finished or stopped meanwhile (one bounce per batch in flight)
        gateway = self._outbox.reply_to(request_id)
        now = time.monotonic()
        if not self._grace.bounced(
            request_id, attempt, now, formatter_id=formatter_id, gateway=gateway
        ):
            return  # its grace is already running
        with bound_contextvars(request_id=request_id, worker_id=self.worker_id):
            log.info("formatter_unreachable", subject=subject, grace_s=FORMATTER_GRACE_S)
            self._grace_tasks.spawn(self._await_grace(request_id), name=f"grace-{request_id}")

    async def _await_grace(self, request_id: str) -> None:
        """Wait out the grace, then ask the formatter whether it is there; if not, stop the
        request (if still here) and tell its gateway (even if it finished meanwhile: its last
        batch bounced too)."""
        while True:  # bounded: one sleep to the end of the grace
            now = time.monotonic()
            grace = self._grace.due(request_id, now)
            if grace is None:
                return  # cancelled meanwhile
            if isinstance(grace, float):
                await asyncio.sleep(grace - now)
                continue
            break
        try:
            if await self._formatter_answers(grace.formatter_id):
                log.info("formatter_back", formatter_id=grace.formatter_id)
                return
            await self._formatter_gone(grace)
        except Exception:  # a task's boundary: log once
            log.exception("formatter_gone_failed")

    async def _formatter_answers(self, formatter_id: str) -> bool:
        """Ping the formatter: False on "no responders" or silence (gone, or hung)."""
        subject = self._subjects.formatter_ping(formatter_id)
        try:
            await self._nc.request(subject, b"", timeout=FORMATTER_PING_TIMEOUT_S)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return False
        return True

    async def _formatter_gone(self, grace: Grace) -> None:
        """Nobody formats this request any more: stop it, free its slot, tell its gateway."""
        request_id = grace.request_id
        emission = None
        if self._outbox.attempt(request_id) == grace.attempt:
            emission = self.engine.cancel(request_id)
            self._outbox.close(request_id)
        log.warning("formatter_gone", formatter_id=grace.formatter_id, stopped=bool(emission))
        if emission is not None:
            await self.phases([emission])
        if grace.gateway is not None:
            failure = FormatterLost("the formatter of this request stopped")
            await self._nc.publish(grace.gateway, codec.encode(failure.to_message(request_id)))
        if not self.engine.has_work:
            self._idle.set()
            await self.publisher.report_load(is_idle=True)

    async def _fail_all(self) -> None:
        failed = InternalError("the engine failed")
        emissions = self.engine.cancel_all()
        for emission in emissions:
            if self._handoffs.fail(emission.request_id, failed):
                continue
            taken = self._outbox.take(emission.request_id)
            self._outbox.close(emission.request_id)
            if taken is not None:
                message = failed.to_message(emission.request_id)
                await self._nc.publish(taken[0], codec.encode(message))
        await self._flush(())
        await self.phases(emissions)
