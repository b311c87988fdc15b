"""Preprocessor wiring: ``Preprocess`` in (queue group), ``StreamOpen`` to a formatter, ``Generate``
out.

The only module that touches NATS. Each message is handled in its own task, so a model's
first (slow) tokenizer load never holds up requests for models already loaded.

Opening a stream (decision 013): with a known live formatter (``FormatterPool``), ``StreamOpen``
goes straight to its direct subject and ``Generate`` follows at once, no round trip; a dead
formatter bounces the open ("no responders"), which cancels the request and answers 503. With
none known, or when a rediscovery is due, the queue-group request/reply handshake is used and
its ``StreamOpened`` teaches the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import bound_contextvars

from services.preprocessor.assets import AssetCache
from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.formatters import FormatterPool
from services.preprocessor.prepare import (
    Prepared,
    generate,
    prepare,
    prompt_chars,
    rendered_chat,
    stream_open,
)
from shared import codec
from shared.bounce import Bounces
from shared.bus import barrier, connect, wait_for_signal
from shared.errors import (
    InternalError,
    InvalidRequest,
    ServiceError,
    ServiceUnavailable,
    UpstreamTimeout,
    from_message,
)
from shared.messages import (
    Cancel,
    FormatterLeaving,
    Preprocess,
    RequestFailed,
    StreamOpen,
    StreamOpened,
)
from shared.metrics import ServiceMetrics, serve_metrics
from shared.registry import ModelFiles
from shared.subjects import Subjects, request_id_of
from shared.warmup import ModelWarmer

log = structlog.get_logger(__name__)

QUEUE = "preprocessor"
OFFLOAD_CHARS = 8_000
"""Prompts with at least this much text to tokenize afresh (not served by the segment cache) are
tokenized on a worker thread: ~2k tokens take ~2 ms, the thread hop ~0.1 ms idle but up to the
GIL switch interval (5 ms) when the loop is busy, and ``encode_batch_fast`` releases the GIL."""
SHUTDOWN_GRACE_S = 10.0

OpenReply = StreamOpened | RequestFailed


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
        self._sub: Subscription | None = None
        self._leaving_sub: Subscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._monotonic = monotonic
        self._bounces: Bounces[str] = Bounces(nc, subjects, self._on_no_router)
        self.formatters = FormatterPool()
        """Formatters that take a direct ``StreamOpen`` (decision 013)."""
        self._open_bounces: Bounces[tuple[str, str]] = Bounces(nc, subjects, self._on_no_formatter)
        self._warmer = ModelWarmer(nc.jetstream(), subjects, assets.get)
        self.metrics.track_in_flight(lambda: len(self._tasks))

    async def start(self) -> None:
        """Join the ``preprocessor`` queue group; returns once the server knows it."""
        await self._bounces.start()
        await self._open_bounces.start()
        self._leaving_sub = await self._nc.subscribe(
            self._subjects.formatter_leaving_all, cb=self._on_formatter_leaving
        )
        self._sub = await self._nc.subscribe(
            self._subjects.preprocess, queue=QUEUE, cb=self._on_message
        )
        await barrier(self._nc)
        await self._warmer.start()

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop taking requests, then let in-flight ones finish (cancelled after ``grace_s``)."""
        await self._warmer.stop()
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self._bounces.stop()
        await self._open_bounces.stop()
        if self._leaving_sub is not None:
            await self._leaving_sub.unsubscribe()
            self._leaving_sub = None
        await self._assets.close()

    async def _on_message(self, msg: Msg) -> None:
        # nats-py awaits callbacks one at a time per subscription: hand off at once.
        task = asyncio.create_task(self.on_preprocess(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def on_preprocess(self, msg: Msg) -> None:
        """Decode, bind, prepare, open a stream, publish; any failure goes to ``reply_to``."""
        with self.metrics.handling("preprocess"):
            await self._on_preprocess(msg)

    async def _on_preprocess(self, msg: Msg) -> None:
        try:
            req = codec.decode(msg.data, Preprocess)
        except codec.DecodeError as exc:
            await self._reject_undecodable(msg, exc)
            return
        started = time.perf_counter()
        with bound_contextvars(request_id=req.request_id):
            try:
                prepared = await self._handle(req)
            except ServiceError as exc:
                self.metrics.error(exc.code)
                log.warning("request_failed", code=exc.code, status=exc.status, error=exc.message)
                await self._reply(req.reply_to, exc.to_message(req.request_id))
            except Exception:  # the handler boundary: log once, answer 500
                self.metrics.error(InternalError.code)
                log.exception("request_crashed", model=req.model)
                failure = InternalError("the preprocessor failed on this request")
                await self._reply(req.reply_to, failure.to_message(req.request_id))
            else:
                log.info(
                    "request_preprocessed",
                    model=req.model,
                    api=req.api,
                    prompt_tokens=prepared.prompt_tokens,
                    max_tokens=prepared.sampling.max_tokens,
                    elapsed_ms=round((time.perf_counter() - started) * 1000, 2),
                )

    async def _handle(self, req: Preprocess) -> Prepared:
        if req.deadline_ms and self._clock() * 1000 > req.deadline_ms:
            raise UpstreamTimeout("the request expired before it was preprocessed")
        assets = await self._assets.get(req.model)
        rendered = None
        offload = prompt_chars(req) >= OFFLOAD_CHARS
        if offload and req.api == "chat":
            # Templating is cheap; tokenizing is not, unless the long parts (a shared system
            # prompt) are cached: then a thread hop would only add latency.
            rendered = rendered_chat(req, assets)
            offload = assets.uncached_chars(rendered) >= OFFLOAD_CHARS
        if offload:
            prepared = await asyncio.to_thread(prepare, req, assets, rendered)
        else:
            prepared = prepare(req, assets, rendered)
        stream_to = await self._open_stream(stream_open(req, prepared))
        data = codec.encode(generate(req, prepared, stream_to))
        # With no router the server bounces this to us at once; we tell the formatter.
        reply = self._bounces.reply_for(req.request_id, stream_to)
        await self._nc.publish(self._subjects.route, data, reply=reply)
        return prepared

    async def _on_no_router(self, request_id: str, stream_to: str, _subject: str) -> None:
        failure = ServiceUnavailable("no router is running")
        self.metrics.error(failure.code)
        await self._reply(stream_to, failure.to_message(request_id))

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

    async def _on_formatter_leaving(self, msg: Msg) -> None:
        try:
            leaving = codec.decode(msg.data, FormatterLeaving)
        except codec.DecodeError as exc:
            log.warning("formatter_leaving_undecodable", error=str(exc))
            return
        if leaving.formatter_id in self.formatters:
            self.formatters.drop(leaving.formatter_id)
            log.info("formatter_left", formatter_id=leaving.formatter_id)

    async def _on_no_formatter(
        self, request_id: str, context: tuple[str, str], _subject: str
    ) -> None:
        """A direct ``StreamOpen`` found nobody: forget that formatter, stop the request, 503."""
        formatter_id, reply_to = context
        self.formatters.drop(formatter_id)
        log.warning("formatter_gone", request_id=request_id, formatter_id=formatter_id)
        cancel = Cancel(request_id=request_id, reason="formatter_unavailable")
        try:
            await self._nc.publish(self._subjects.cancel, codec.encode(cancel))
        except nats.errors.Error as exc:
            log.warning("cancel_failed", request_id=request_id, error=str(exc))
        failure = ServiceUnavailable("the formatter for this request is gone")
        self.metrics.error(failure.code)
        await self._reply(reply_to, failure.to_message(request_id))

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
            raise UpstreamTimeout(f"no formatter answered within {timeout_s} s") from exc
        answer: OpenReply = codec.decode(reply.data, OpenReply)  # type: ignore[arg-type]
        if isinstance(answer, RequestFailed):
            raise from_message(answer)
        formatter_id = answer.formatter_id
        if formatter_id and answer.stream_to == self._subjects.stream(
            formatter_id, open_msg.request_id
        ):
            self.formatters.learn(formatter_id, self._monotonic())
        return answer.stream_to

    async def _reply(self, subject: str, failed: RequestFailed) -> None:
        try:
            await self._nc.publish(subject, codec.encode(failed))
        except nats.errors.Error as exc:
            log.warning("reply_failed", subject=subject, error=str(exc))

    async def _reject_undecodable(self, msg: Msg, exc: Exception) -> None:
        self.metrics.error(InvalidRequest.code)
        log.warning("message_undecodable", subject=msg.subject, error=str(exc))
        if msg.reply:
            failure = InvalidRequest(f"undecodable Preprocess message: {exc}")
            await self._reply(msg.reply, failure.to_message(request_id_of(msg.reply)))


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


@asynccontextmanager
async def serving(config: PreprocessorConfig) -> AsyncIterator[Preprocessor]:
    """Connect, serve until the block exits, then stop and drain."""
    nc = await connect(config.nats_url, name="preprocessor")
    try:
        service = build_preprocessor(config, nc)
        serve_metrics(service.metrics, config.metrics_port)
        await service.start()
        log.info("preprocessor_started", namespace=config.namespace)
        try:
            yield service
        finally:
            await service.stop()
            log.info("preprocessor_stopped")
    finally:
        await nc.drain()


async def main(config: PreprocessorConfig) -> None:
    """Serve until SIGINT or SIGTERM."""
    async with serving(config):
        await wait_for_signal()
