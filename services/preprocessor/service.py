"""Preprocessor wiring: ``Preprocess`` in (queue group), ``StreamOpen`` to a formatter, ``Generate``
out.

The only module that touches NATS; every subscription goes through the shared handler boundary
(``shared.handlers``). Each request is handled in its own task, so a model's first (slow)
tokenizer load never holds up requests for models already loaded.

Opening a stream (decision 013): with a known live formatter (``FormatterPool``), ``StreamOpen``
goes straight to its direct subject and ``Generate`` follows at once, no round trip; a dead
formatter bounces the open ("no responders"), which cancels the request and answers 503. With
none known, or when a rediscovery is due, the queue-group request/reply handshake is used and
its ``StreamOpened`` teaches the pool.

Who holds a request (decision 018): a gateway's ``StreamResume`` reaches every preprocessor; one
still preparing that request (its ``StreamOpen``/``Generate`` not yet sent) answers
``StreamHeld``, the others stay silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import bound_contextvars

from services.preprocessor import embed
from services.preprocessor.assets import AssetCache
from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.count import Counter
from services.preprocessor.formatters import FormatterPool
from services.preprocessor.image_fetch import ImageLoader
from services.preprocessor.images import image_refs, refused
from services.preprocessor.prepare import (
    Prepared,
    generate,
    prepare,
    prompt_chars,
    rendered_chat,
    stream_open,
)
from shared import codec, lifecycle
from shared.bounce import Bounces
from shared.bus import barrier, drain_subscription
from shared.errors import ServiceUnavailable, UpstreamTimeout, from_message
from shared.handlers import Boundary
from shared.messages import (
    Cancel,
    FormatterLeaving,
    Preprocess,
    RequestFailed,
    StreamHeld,
    StreamOpen,
    StreamOpened,
    StreamResume,
)
from shared.metrics import ServiceMetrics
from shared.registry import ModelFiles
from shared.subjects import Subjects
from shared.tasks import TaskSet
from shared.warmup import ModelWarmer

log = structlog.get_logger(__name__)

QUEUE = "preprocessor"
OFFLOAD_CHARS = 8_000
"""Prompts with at least this much text to tokenize afresh (not served by the segment cache) are
tokenized on a worker thread: ~2k tokens take ~2 ms, the thread hop ~0.1 ms idle but up to the
GIL switch interval (5 ms) when the loop is busy, and ``encode_batch_fast`` releases the GIL."""

BUS_MARGIN_BYTES = 16 * 1024
"""Room left under the server's ``max_payload`` for headers and a ``StreamOpen``'s own fields."""

WARM_BEFORE_SERVING_S = 30.0
"""At start, the longest wait for the served models' tokenizers before taking requests."""

OpenReply = StreamOpened | RequestFailed
_OPEN_REPLIES: codec.Decoder[OpenReply] = codec.Decoder(OpenReply)


def _reply_to(req: Preprocess) -> str:
    return req.reply_to


class Preprocessor:
    """Subscribes to ``subjects.preprocess`` and turns each request into a ``Generate``."""

    def __init__(
        self,
        config: PreprocessorConfig,
        nc: Client,
        subjects: Subjects,
        assets: AssetCache,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self._config = config
        self.metrics = metrics or ServiceMetrics("preprocessor")
        self._nc = nc
        self._subjects = subjects
        self._assets = assets
        self._clock = clock
        self._monotonic = monotonic
        self._boundary = Boundary(nc, self.metrics)
        self._tasks = TaskSet()
        self._sub: Subscription | None = None
        self._leaving_sub: Subscription | None = None
        self._resume_sub: Subscription | None = None
        self._preparing: set[str] = set()
        """Requests in ``on_preprocess`` now: a ``StreamResume`` for one is answered."""
        self._bounces: Bounces[str] = Bounces(nc, subjects, self._on_no_router)
        self.formatters = FormatterPool()
        """Formatters that take a direct ``StreamOpen`` (decision 013)."""
        self._open_bounces: Bounces[tuple[str, str]] = Bounces(nc, subjects, self._on_no_formatter)
        self._warmer = ModelWarmer(nc.jetstream(), subjects, assets.get)
        self._images = ImageLoader(config.image_limits(), timeout_s=config.image_fetch_timeout_s)
        """Reads requests' images (decision 032); its HTTP client serves every fetch."""
        self._is_debug = log.is_enabled_for(logging.DEBUG)
        """Per-request lines are DEBUG; at INFO their fields are not even built."""
        self.metrics.track_in_flight(lambda: len(self._tasks))

    @property
    def service_metrics(self) -> ServiceMetrics:
        return self.metrics

    async def start(self) -> None:
        """Load the models workers serve now, then join the ``preprocessor`` queue group;
        returns once the server knows it."""
        await self._warmer.start()
        await self._warmer.ready(WARM_BEFORE_SERVING_S)
        await self._bounces.start()
        await self._open_bounces.start()
        # No queue group: the gateway asks every preprocessor, the one preparing it answers.
        self._resume_sub = await self._nc.subscribe(
            self._subjects.stream_resume, cb=self.on_stream_resume
        )
        on = self._boundary.handler
        on_leaving = on(codec.decoder(FormatterLeaving), "formatter_leaving", self.on_leaving)
        self._leaving_sub = await self._nc.subscribe(
            self._subjects.formatter_leaving_all, cb=on_leaving
        )
        on_preprocess = on(
            codec.decoder(Preprocess),
            "preprocess",
            self.on_preprocess,
            reply_to=_reply_to,
            tasks=self._tasks,  # a model's first (slow) load must not hold up other requests
        )
        self._sub = await self._nc.subscribe(
            self._subjects.preprocess, queue=QUEUE, cb=on_preprocess
        )
        await embed.subscribe(
            self._nc, self._subjects, self._assets, self._boundary, self._bounces, self._tasks
        )
        # /v1/messages/count_tokens (count.py): request/reply, in the same queue group.
        counter = Counter(self._assets.get, self._tasks, clock=self._clock, images=self._images)
        await self._nc.subscribe(self._subjects.count_tokens, queue=QUEUE, cb=counter.on_message)
        await barrier(self._nc)

    async def stop(self) -> None:
        """Stop taking requests; in-flight ones may finish within ``shutdown_grace_s``."""
        await self._warmer.stop()
        if self._sub is not None:  # drain: requests already delivered here are still served
            await drain_subscription(self._sub)
            self._sub = None
        await self._tasks.close(self._config.shutdown_grace_s)
        await self._bounces.stop()
        await self._open_bounces.stop()
        if self._leaving_sub is not None:
            await self._leaving_sub.unsubscribe()
            self._leaving_sub = None
        if self._resume_sub is not None:
            await self._resume_sub.unsubscribe()
            self._resume_sub = None
        await self._assets.close()
        await self._images.close()

    async def on_preprocess(self, req: Preprocess) -> None:
        """Prepare, open a stream on a formatter, send ``Generate`` to the routers; until then
        (or a failure), a ``StreamResume`` for the request is answered here."""
        self._preparing.add(req.request_id)
        try:
            await self._preprocess(req)
        finally:
            self._preparing.discard(req.request_id)

    async def on_stream_resume(self, msg: Msg) -> None:
        """Answer ``StreamHeld`` for a request being prepared here; say nothing otherwise."""
        try:
            resume = codec.decode(msg.data, StreamResume)
        except codec.DecodeError as exc:
            self.metrics.error("message_undecodable")
            log.warning(
                "message_undecodable", subject=msg.subject, kind="stream_resume", error=str(exc)
            )
            return
        if resume.request_id not in self._preparing or not msg.reply:
            return
        held = StreamHeld(request_id=resume.request_id, holder="preprocessor")
        with contextlib.suppress(nats.errors.Error):  # the asker gave up: nothing to do
            await msg.respond(codec.encode(held))

    async def _preprocess(self, req: Preprocess) -> None:
        started = time.perf_counter()
        if req.deadline_ms and self._clock() * 1000 > req.deadline_ms:
            raise UpstreamTimeout("the request expired before it was preprocessed")
        prepared = await self._prepare(req)
        if prepared.images:
            self._check_fits_the_bus(req, prepared)
        config = self._config
        open_msg = stream_open(
            req,
            prepared,
            migration_limit=config.migration_limit,
            max_seq_len=config.migration_max_seq_len,
        )
        stream_to = await self._open_stream(open_msg)
        data = codec.encode(generate(req, prepared, stream_to))
        # With no router the server bounces this to us at once; we tell the formatter.
        reply = self._bounces.reply_for(req.request_id, stream_to)
        await self._nc.publish(self._subjects.route, data, reply=reply)
        if self._is_debug:
            log.debug(
                "request_preprocessed",
                model=req.model,
                api=req.api,
                prompt_tokens=prepared.prompt_tokens,
                max_tokens=prepared.sampling.max_tokens,
                elapsed_ms=round((time.perf_counter() - started) * 1000, 2),
            )

    async def _prepare(self, req: Preprocess) -> Prepared:
        """Template and tokenize; long prompts not served by the segment cache off the loop."""
        assets = await self._assets.get(req.model)
        images = await self._images.load(req, assets.vision)
        if images:  # reading images is the slow part; the prompt is short next to them
            return await asyncio.to_thread(prepare, req, assets, None, images)
        rendered = None
        offload = prompt_chars(req) >= OFFLOAD_CHARS
        if offload and req.api == "chat":
            # Templating is cheap; tokenizing is not, unless the long parts (a shared system
            # prompt) are cached: then a thread hop would only add latency.
            rendered = rendered_chat(req, assets)
            offload = assets.uncached_chars(rendered) >= OFFLOAD_CHARS
        if offload:
            return await asyncio.to_thread(prepare, req, assets, rendered)
        return prepare(req, assets, rendered)

    def _check_fits_the_bus(self, req: Preprocess, prepared: Prepared) -> None:
        """A request whose images make its ``Generate`` larger than the bus carries is a 400
        naming its largest image (not a publish failure later)."""
        size = len(codec.encode(generate(req, prepared, self._subjects.route)))
        limit = self._nc.max_payload - BUS_MARGIN_BYTES
        if size > limit:
            largest = max(prepared.images, key=lambda i: len(i.data))
            index = prepared.images.index(largest)
            param = image_refs(req.messages)[index].param
            raise refused(
                param,
                f"the request's images make it {size} bytes; the bus carries at most {limit} "
                "(send smaller images, or raise the NATS server's max_payload).",
            )

    async def _on_no_router(self, request_id: str, stream_to: str, _subject: str) -> None:
        with bound_contextvars(request_id=request_id):
            failure = ServiceUnavailable("no router is running")
            await self._boundary.fail(stream_to, request_id, failure)

    async def _open_stream(self, open_msg: StreamOpen) -> str:
        """Give this request to a formatter; returns where workers should stream to."""
        formatter_id = self.formatters.pick(self._monotonic()) if self._config.direct_open else None
        if formatter_id is None:
            return await self._request_stream(open_msg)
        request_id = open_msg.request_id
        # Not awaited: a dead formatter bounces this to _on_no_formatter within a millisecond.
        reply = self._open_bounces.reply_for(request_id, (formatter_id, open_msg.reply_to))
        await self._nc.publish(
            self._subjects.formatter_open_direct(formatter_id), codec.encode(open_msg), reply=reply
        )
        return self._subjects.stream(formatter_id, request_id)

    async def on_leaving(self, leaving: FormatterLeaving) -> None:
        """A formatter is stopping: open no more streams on it directly."""
        if leaving.formatter_id in self.formatters:
            self.formatters.drop(leaving.formatter_id)
            log.info("formatter_left", formatter_id=leaving.formatter_id)

    async def _on_no_formatter(
        self, request_id: str, context: tuple[str, str], _subject: str
    ) -> None:
        """A direct ``StreamOpen`` found nobody: forget that formatter, stop the request, 503."""
        formatter_id, reply_to = context
        self.formatters.drop(formatter_id)
        with bound_contextvars(request_id=request_id):
            log.warning("formatter_gone", formatter_id=formatter_id)
            cancel = Cancel(request_id=request_id, reason="formatter_unavailable")
            try:
                await self._nc.publish(self._subjects.cancel, codec.encode(cancel))
            except nats.errors.Error as exc:
                log.warning("cancel_failed", error=str(exc))
            failure = ServiceUnavailable("the formatter for this request is gone")
            await self._boundary.fail(reply_to, request_id, failure)

    async def _request_stream(self, open_msg: StreamOpen) -> str:
        """Ask the formatter queue group to take this request (and learn who answered)."""
        timeout_s = self._config.formatter_timeout_s
        try:
            reply = await self._nc.request(
                self._subjects.formatter_open, codec.encode(open_msg), timeout=timeout_s
            )
        except nats.errors.NoRespondersError as exc:
            self.formatters.clear()
            raise ServiceUnavailable("no formatter is running") from exc
        except nats.errors.TimeoutError as exc:
            # The handshake or its answer was lost in transit (a node stopped under it), or the
            # formatters are overwhelmed: a passing 503, which the gateway resubmits (decision
            # 018), not a 504 that ends the request.
            raise ServiceUnavailable(f"no formatter answered within {timeout_s:g} s") from exc
        answer = _OPEN_REPLIES.decode(reply.data)
        if isinstance(answer, RequestFailed):
            raise from_message(answer)  # counted and logged under the formatter's code
        formatter_id = answer.formatter_id
        if formatter_id and answer.stream_to == self._subjects.stream(
            formatter_id, open_msg.request_id
        ):
            self.formatters.learn(formatter_id, self._monotonic())
        return answer.stream_to


def build_preprocessor(
    config: PreprocessorConfig, nc: Client, *, metrics: ServiceMetrics | None = None
) -> Preprocessor:
    """Compose the service from its config and a NATS connection."""
    subjects = Subjects(config.namespace)
    assets = AssetCache(
        ModelFiles(nc.jetstream(), subjects),
        max_model_len=config.max_model_len,
        max_models=config.max_cached_models,
    )
    return Preprocessor(config, nc, subjects, assets, metrics=metrics)


def serving(config: PreprocessorConfig) -> AbstractAsyncContextManager[Preprocessor]:
    """Connect, build and start a preprocessor; stop it and drain on the way out."""
    return lifecycle.serving(config, "preprocessor", lambda nc: build_preprocessor(config, nc))
