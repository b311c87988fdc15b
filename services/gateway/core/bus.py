"""NatsBus, the gateway's NATS side (``port.GatewayBus``): publish ``Preprocess`` (or
``TensorInfer`` straight to a tensor worker), demux replies per request.

One wildcard subscription (``subjects.reply_all(gateway_id)``) feeds one ``Inbox`` per
in-flight request, its chunks in ``seq`` order (decision 018: a chunk past a hole, a silent
request or a connection back makes ``probes.Prober`` ask who holds it and for a replay). Every
wait has a timeout; a timeout or a client disconnect publishes ``Cancel`` so the rest of the
pipeline stops work. HTTP and gRPC share one bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.errors import MaxPayloadError
from nats.js.client import JetStreamContext

from services.gateway.config import GatewayConfig
from services.gateway.core.errors import (
    ClientTooSlow,
    DuplicateRequestId,
    NoResponders,
    no_live_worker,
)
from services.gateway.core.inbox import Inbox, Probe, ReplyItem
from services.gateway.core.port import ReplyBus
from services.gateway.core.probes import Prober
from services.gateway.core.retry import RetryBudget, attempt_id
from shared import busy_thresholds, codec
from shared.bus import connect, no_responders
from shared.bus_permissions import inbox_prefix
from shared.errors import (
    InternalError,
    InvalidRequest,
    ModelNotFound,
    ServiceError,
    ServiceUnavailable,
    UpstreamTimeout,
    from_message,
)
from shared.messages import (
    BusyThresholdsChanged,
    Cancel,
    CountTokens,
    Embed,
    EmbedResult,
    GatewayEvent,
    LoraAdapterAnswer,
    LoraCommand,
    MediaGenerate,
    MediaResult,
    ModelCard,
    Preprocess,
    RequestFailed,
    ResponseChunk,
    TensorInfer,
    TensorResult,
    TokenCount,
    WorkerCard,
)
from shared.metrics import ServiceMetrics
from shared.recent import RecentIds
from shared.registry import ModelFiles, WorkerDirectory
from shared.subjects import Subjects, request_id_of
from shared.tasks import TaskSet

log = structlog.get_logger(__name__)

__all__ = ["Inbox", "NatsBus", "Reply", "ReplyItem"]

BUS_WAIT_S = 2.0
"""A request that arrives while NATS is unreachable waits this long for it, then gets a 503."""
BUS_LOST_GRACE_S = 5.0
"""Requests in flight outlive a lost connection this long: back sooner, each is asked for (a
replay of) what it missed (decision 018); later, each fails with a typed 503, as before."""
BUS_UNAVAILABLE = "The message bus is unavailable."
USED_ID_TTL_S = 60.0
"""A reused request id gets a fresh bus id this long after its last use (longer than any
service remembers a finished id)."""
USED_ID_MAX = 100_000
_EMBED_ANSWERS: codec.Decoder[EmbedResult | RequestFailed] = codec.Decoder(
    EmbedResult | RequestFailed
)
_MEDIA_ANSWERS: codec.Decoder[MediaResult | RequestFailed] = codec.Decoder(
    MediaResult | RequestFailed
)
_COUNT_ANSWERS: codec.Decoder[TokenCount | RequestFailed] = codec.Decoder(
    TokenCount | RequestFailed
)
_LORA_ANSWERS: codec.Decoder[LoraAdapterAnswer | RequestFailed] = codec.Decoder(
    LoraAdapterAnswer | RequestFailed
)
T = TypeVar("T")


class Reply:
    """The replies of one request, in arrival order. Always ``close()`` it when done.

    Until its first chunk, a ``Preprocess`` request that fails with a resubmittable error is
    sent again under a new id (``retry.py``); the caller only sees the outcome.
    """

    __slots__ = ("_bus", "_inbox", "_request", "_retry", "request_id")

    def __init__(
        self,
        bus: ReplyBus,
        request_id: str,
        inbox: Inbox,
        request: Preprocess | None = None,
        retry: RetryBudget | None = None,
    ) -> None:
        self._bus = bus
        self._inbox = inbox
        self.request_id = request_id
        self._request = request
        """Kept until the first chunk, to resubmit."""
        self._retry = retry

    async def next(self, timeout_s: float) -> ResponseChunk:
        """The next chunk; raises the upstream's error, or ``UpstreamTimeout`` (and cancels)."""
        while True:
            item = await self._take(timeout_s)
            if not isinstance(item, ServiceError):
                break
            if not await self._resubmitted(item):
                if isinstance(item, ClientTooSlow):
                    self.cancel(item.code)  # the worker stops too
                else:
                    self.close()
                raise item
        if isinstance(item, TensorResult):
            raise self._unexpected(item)
        self._request = None
        return item

    async def _resubmitted(self, error: ServiceError) -> bool:
        """Send the request again if it may be (nothing delivered yet, budget left)."""
        request, retry = self._request, self._retry
        if request is None or retry is None:
            return False
        delay = retry.delay(error.code, time.monotonic())
        if delay is None:
            return False
        log.info(
            "request_resubmitted",
            request_id=self.request_id,
            code=error.code,
            attempt=retry.attempts,
            delay_s=delay,
        )
        self._bus.cancel_soon(self.request_id, "resubmitted")
        await asyncio.sleep(delay)
        request_id = attempt_id(request.request_id, retry.attempts)
        request = msgspec.structs.replace(
            request, request_id=request_id, reply_to=self._bus.reply_subject(request_id)
        )
        try:
            await self._bus.resend(request, self._inbox)
        except ServiceError:
            return False
        self.request_id = request_id
        return True

    async def result(self, timeout_s: float) -> TensorResult:
        """A tensor request's result; raises as ``next()`` does. ``close()`` it afterwards."""
        item = await self._take(timeout_s)
        if isinstance(item, ServiceError):
            self.close()
            raise item
        if isinstance(item, ResponseChunk):
            raise self._unexpected(item)
        return item

    async def _take(self, timeout_s: float) -> ReplyItem:
        inbox = self._inbox
        if inbox.empty() and not await inbox.wait(timeout_s):
            self.cancel("timeout")
            raise UpstreamTimeout(f"No response from upstream within {timeout_s:g}s.")
        return inbox.get_nowait()

    def _unexpected(self, item: ReplyItem) -> ServiceError:
        """The error for a reply of the other kind (a chunk for a tensor request, or back)."""
        self.cancel("internal_error")
        return InternalError(f"An upstream service sent an unexpected {type(item).__name__}.")

    @property
    def ready(self) -> bool:
        """Whether ``next()`` would return (or raise) without waiting."""
        return not self._inbox.empty()

    async def wait(self, timeout_s: float) -> bool:
        """Whether a reply is in, waiting up to ``timeout_s`` for one (never raises, never
        cancels: ``next()`` keeps the request's own time limit)."""
        return await self._inbox.wait(timeout_s)

    def interrupt(self, error: ServiceError) -> None:
        """Make the pending (or next) ``next()`` raise ``error`` after the replies already in."""
        self._inbox.put_nowait(error)

    def cancel(self, reason: str) -> None:
        """Stop listening and tell the pipeline to stop work (safe inside a cancelled task)."""
        self._bus.cancel_soon(self.request_id, reason)

    def close(self) -> None:
        """Stop listening; late replies for this request are dropped."""
        self._bus.forget(self.request_id)


class NatsBus:
    """Owns the NATS connection, the live-worker view and the per-request reply queues."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        subjects: Subjects | None = None,
        clock: Callable[[], float] = time.time,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self._config = config
        self._replies = (metrics or ServiceMetrics("gateway")).messages.labels("gateway", "reply")
        self.subjects = subjects or Subjects(config.namespace)
        self._clock = clock
        self._nc: Client | None = None
        self._sub: Subscription | None = None
        self._directory: WorkerDirectory | None = None
        self._files: ModelFiles | None = None
        self._pending: dict[str, Inbox] = {}
        self._used = RecentIds(ttl_s=USED_ID_TTL_S, max_size=USED_ID_MAX)
        """Bus ids sent lately (``bus_id``)."""
        self._turns: dict[str, int] = {}
        """Per model: how many tensor requests were sent (round-robin over its live workers)."""
        self._background = TaskSet()
        self._bus_up = asyncio.Event()
        self._prober = Prober(self.subjects, self._pending)
        self._grace: asyncio.TimerHandle | None = None
        """While the connection is lost: when the requests in flight fail."""

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, load the worker registry, and subscribe to this gateway's replies."""
        config = self._config
        nc = await connect(
            config.nats_url,
            name=f"gateway-{config.gateway_id}",
            on_lost=self._on_bus_lost,
            on_back=self._on_bus_back,
            inbox_prefix=inbox_prefix("gateway"),
            **config.nats_auth().connect_options(),
        )
        self._nc = nc
        self._bus_up.set()
        js = nc.jetstream()
        self._directory = WorkerDirectory(
            js, self.subjects, ttl_s=config.worker_ttl_s, clock=self._clock
        )
        await self._directory.start()
        self._files = ModelFiles(js, self.subjects)
        await self._files.watch()  # a model republished with another card is read afresh
        self._sub = await nc.subscribe(
            self.subjects.reply_all(config.gateway_id), cb=self._on_reply
        )
        await nc.flush()
        self._prober.start(nc)
        log.info("bus_started", gateway_id=config.gateway_id, namespace=self.subjects.namespace)

    async def stop(self) -> None:
        """Flush pending cancels, stop watching the registry and drain the connection."""
        await self._prober.stop()
        if self._grace is not None:
            self._grace.cancel()
        await self._background.close(grace_s=2)
        if self._directory is not None:
            await self._directory.stop()
        if self._files is not None:
            await self._files.stop()
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(NatsError, TimeoutError):
                await self._nc.drain()
        log.info("bus_stopped", in_flight=len(self._pending))

    @property
    def is_connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def _on_bus_lost(self) -> None:
        """Keep the requests in flight for ``BUS_LOST_GRACE_S``; fail them if still lost then.

        Core NATS keeps nothing for a subscriber that is away, so replies sent meanwhile are
        lost; a connection back in time asks the formatters to replay them (``_on_bus_back``).
        """
        self._bus_up.clear()
        self._prober.on_lost()
        if self._nc is not None and self._nc.is_closed:
            self._fail_in_flight()  # closed for good (stop): it will not come back
            return
        if self._grace is None:
            loop = asyncio.get_running_loop()
            self._grace = loop.call_later(BUS_LOST_GRACE_S, self._fail_in_flight)
        if self._pending:
            log.warning("bus_lost_requests_held", in_flight=len(self._pending))

    def _fail_in_flight(self) -> None:
        """Fail every request in flight at once (503, retryable) and cancel its work.

        The cancels wait in nats-py's buffer and go out when the connection is back.
        """
        if self._grace is not None:
            self._grace.cancel()  # a no-op when it is the timer that called
            self._grace = None
        pending = list(self._pending.items())
        self._pending.clear()  # cleared, not replaced: the prober reads the same dict
        if pending:
            log.warning("bus_lost_requests_failed", in_flight=len(pending))
        for request_id, inbox in pending:
            inbox.put_nowait(ServiceUnavailable(BUS_UNAVAILABLE))
            self._background.spawn(self._publish_cancel(request_id, "bus_lost"))

    async def _on_bus_back(self) -> None:
        """Take requests again, and ask about every one in flight (what did it miss?)."""
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        self._bus_up.set()
        self._prober.on_back()

    async def _bus_ready(self) -> None:
        """Return once NATS is connected, waiting up to ``BUS_WAIT_S``; else 503 (retryable)."""
        if self._bus_up.is_set():
            return
        try:
            await asyncio.wait_for(self._bus_up.wait(), BUS_WAIT_S)
        except TimeoutError:
            raise ServiceUnavailable(BUS_UNAVAILABLE) from None

    @property
    def in_flight(self) -> int:
        """Requests waiting for replies right now."""
        return len(self._pending)

    def jetstream(self) -> JetStreamContext:
        """JetStream on the bus connection (the stored Responses turns, ``turn_store``)."""
        assert self._nc is not None, "start() first"
        return self._nc.jetstream()

    def max_payload(self) -> int:
        """The largest message the server takes, bytes."""
        assert self._nc is not None, "start() first"
        return self._nc.max_payload

    # --- models ----------------------------------------------------------------------------------

    def live_models(self) -> list[str]:
        """Models with at least one live worker, sorted."""
        return sorted(self._directory.models()) if self._directory else []

    def live_workers(self, model: str) -> list[WorkerCard]:
        """The live workers' cards of ``model`` (no I/O; empty before ``start``)."""
        return list(self._directory.live(model)) if self._directory else []

    def is_live(self, model: str) -> bool:
        """Whether ``model`` has a live worker right now (no I/O)."""
        return self._directory is not None and bool(self._directory.live(model))

    def workers_in_turn(self, model: str) -> list[str]:
        """The live workers of ``model``, the next one in round-robin order first."""
        assert self._directory is not None, "start() first"
        live = self._directory.live(model)
        if not live:
            return []
        turn = self._turns.get(model, 0)
        self._turns[model] = turn + 1
        start = turn % len(live)
        return [card.worker_id for card in (*live[start:], *live[:start])]

    async def check_model(self, model: str) -> None:
        """Pass when ``model`` has a live worker; else 503 (known) or 404 (never published)."""
        assert self._directory is not None, "start() first"
        if self._directory.live(model):
            return
        await self._bus_ready()
        if await self.model_card(model) is None:
            raise ModelNotFound(model)
        raise no_live_worker(model)

    async def model_card(self, model: str) -> ModelCard | None:
        """The model's card from the object store (cached until the store changes it)."""
        assert self._files is not None, "start() first"
        try:
            return await self._files.card(model)
        except (NatsError, TimeoutError) as exc:
            raise ServiceUnavailable("The model registry is unavailable.") from exc

    # --- request path ----------------------------------------------------------------------------

    def reply_subject(self, request_id: str) -> str:
        """Where every hop sends this request's replies."""
        return self.subjects.reply(self._config.gateway_id, request_id)

    async def submit(self, request: Preprocess) -> Reply:
        """Start listening for the request's replies, then publish it to the preprocessors."""
        retry = RetryBudget(self._config.retry_budget_s)
        return await self._send(self.subjects.preprocess, request, retry=retry)

    async def resend(self, request: Preprocess, inbox: Inbox) -> None:
        """Publish a resubmission whose replies go to an existing inbox."""
        inbox.restart(time.monotonic())
        await self._publish(self.subjects.preprocess, request, inbox)

    async def submit_tensor(self, request: TensorInfer, worker_id: str) -> Reply:
        """Start listening for the result, then publish the request to one tensor worker."""
        unreachable = f"The worker `{worker_id}` of `{request.model}` is not running."
        subject = self.subjects.tensor_infer(worker_id)
        return await self._send(subject, request, unreachable)

    async def _send(
        self,
        subject: str,
        request: Preprocess | TensorInfer,
        unreachable: str | None = None,
        *,
        retry: RetryBudget | None = None,
    ) -> Reply:
        request_id = request.request_id
        if request_id in self._pending:
            raise DuplicateRequestId(
                f"Request id `{request_id}` is already in flight.", param="X-Request-Id"
            )
        limit = self._config.max_buffered_bytes_per_request
        if unreachable is None:
            inbox = Inbox(max_bytes=limit, probe=Probe(time.monotonic()))
        else:
            inbox = Inbox(unreachable, limit)
        await self._publish(subject, request, inbox)
        if isinstance(request, Preprocess):
            return Reply(self, request_id, inbox, request, retry)
        return Reply(self, request_id, inbox)

    async def _publish(self, subject: str, request: Preprocess | TensorInfer, inbox: Inbox) -> None:
        """Route the request's replies to ``inbox``, then publish it (once the bus is up)."""
        assert self._nc is not None, "start() first"
        await self._bus_ready()
        self._pending[request.request_id] = inbox
        try:
            # reply= makes NATS answer "no responders" at once when nobody listens.
            await self._nc.publish(subject, codec.encode(request), reply=request.reply_to)
        except NatsError as exc:
            self.forget(request.request_id)
            raise ServiceUnavailable(BUS_UNAVAILABLE) from exc

    def forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def bus_id(self, request_id: str) -> str:
        """The id to send a new request under: ``request_id`` itself, unless a request that
        finished recently had it (a client reusing its ``X-Request-Id``): the services remember
        finished ids for a while (decision 013) and would take the new request for a late copy
        of the old one, so it gets a random suffix. One still in flight keeps its id and is
        refused as a duplicate."""
        now = time.monotonic()
        chosen = request_id
        if request_id in self._used and request_id not in self._pending:
            chosen = f"{request_id}-{secrets.token_hex(4)}"
        self._used.add(chosen, now)
        return chosen

    async def embed(self, request: Embed, timeout_s: float) -> EmbedResult:
        """Ask the preprocessors to embed ``request``."""
        return await self.ask(self.subjects.embed, request, _EMBED_ANSWERS, timeout_s, "input")

    async def count_tokens(self, request: CountTokens, timeout_s: float) -> int:
        """Ask the preprocessors how many tokens ``request``'s prompt has."""
        answer = await self.ask(self.subjects.count_tokens, request, _COUNT_ANSWERS, timeout_s)
        return answer.input_tokens

    async def busy_thresholds(self, model: str | None = None) -> list[BusyThresholdsChanged]:
        """The busy thresholds set per model (``model``: only its entry), as stored."""
        assert self._nc is not None, "start() first"
        js = self._nc.jetstream()
        try:
            if model is None:
                return await busy_thresholds.stored(js, self.subjects)
            found = await busy_thresholds.stored_for(js, self.subjects, model)
        except (NatsError, TimeoutError) as exc:
            raise ServiceUnavailable(f"The busy thresholds cannot be read: {exc}") from exc
        return [] if found is None else [found]

    async def lora_command(
        self, worker_id: str, command: LoraCommand, timeout_s: float
    ) -> LoraAdapterAnswer:
        """Ask one worker to load or unload a LoRA adapter (decision 031)."""
        return await self.ask(
            self.subjects.worker_lora(worker_id),
            command,
            _LORA_ANSWERS,
            timeout_s,
            unreachable=f"The worker `{worker_id}` is not running.",
        )

    async def set_busy_thresholds(self, message: BusyThresholdsChanged) -> BusyThresholdsChanged:
        """Store one model's thresholds, then tell every router (the stored revision along)."""
        assert self._nc is not None, "start() first"
        try:
            stored = await busy_thresholds.store(
                self._nc.jetstream(), self.subjects, message, replicas=self._config.js_replicas
            )
            await self._nc.publish(self.subjects.busy_threshold, codec.encode(stored))
        except (NatsError, TimeoutError) as exc:
            raise ServiceUnavailable(f"The busy thresholds cannot be stored: {exc}") from exc
        return stored

    async def generate_media(
        self, request: MediaGenerate, worker_id: str, timeout_s: float
    ) -> MediaResult:
        """Ask one media worker to generate ``request``."""
        return await self.ask(
            self.subjects.media_generate(worker_id),
            request,
            _MEDIA_ANSWERS,
            timeout_s,
            param="prompt",
            unreachable=f"The worker `{worker_id}` of `{request.model}` is not running.",
        )

    async def ask(
        self,
        subject: str,
        request: msgspec.Struct,
        answers: codec.Decoder[T | RequestFailed],
        timeout_s: float,
        param: str | None = None,
        unreachable: str = "No preprocessor is running.",
    ) -> T:
        """One request/reply with the preprocessors on a private inbox (its address also in
        ``reply_to`` where the message has one); every hop's failure comes back typed, silence
        past ``timeout_s`` is a 504, a body over NATS' limit a 400 naming ``param``, nobody
        listening on ``subject`` a ``NoResponders`` 503 saying ``unreachable``."""
        assert self._nc is not None, "start() first"
        await self._bus_ready()
        nc = self._nc
        inbox = nc.new_inbox()
        if "reply_to" in request.__struct_fields__:
            request = msgspec.structs.replace(request, reply_to=inbox)
        sub = await nc.subscribe(inbox, max_msgs=1)
        try:
            await nc.publish(subject, codec.encode(request), reply=inbox)
            msg = await sub.next_msg(timeout=timeout_s)
        except TimeoutError:
            raise UpstreamTimeout(f"No response from upstream within {timeout_s:g}s.") from None
        except MaxPayloadError:
            raise InvalidRequest("The request is too large.", param=param) from None
        except NatsError as exc:
            raise ServiceUnavailable(BUS_UNAVAILABLE) from exc
        finally:
            with contextlib.suppress(NatsError):
                await sub.unsubscribe()
        if no_responders(msg) is not None:
            raise NoResponders(unreachable)
        try:
            answer = answers.decode(msg.data)
        except codec.DecodeError:
            raise InternalError("An upstream service sent an undecodable reply.") from None
        if isinstance(answer, RequestFailed):
            raise from_message(answer)
        return answer

    def cancel_soon(self, request_id: str, reason: str) -> None:
        """Forget the request and publish ``Cancel`` from a task of its own.

        A task, because this runs where the caller is being cancelled (client disconnect), and
        an ``await`` there would be interrupted before the publish happened.
        """
        self.forget(request_id)
        self._background.spawn(self._publish_cancel(request_id, reason))

    async def _publish_cancel(self, request_id: str, reason: str) -> None:
        if self._nc is None or self._nc.is_closed:
            return
        try:
            cancel = Cancel(request_id=request_id, reason=reason)
            await self._nc.publish(self.subjects.cancel, codec.encode(cancel))
        except NatsError as exc:
            log.warning("cancel_publish_failed", request_id=request_id, error=str(exc))
            return
        log.debug("request_cancelled", request_id=request_id, reason=reason)

    async def _on_reply(self, msg: Msg) -> None:
        self._replies.inc()
        request_id = request_id_of(msg.subject)
        inbox = self._pending.get(request_id)
        if inbox is None:
            log.debug("reply_dropped", subject=msg.subject)
            return
        if no_responders(msg) is not None:
            _end(inbox, NoResponders(inbox.unreachable))
            return
        try:
            event: GatewayEvent = codec.GATEWAY_EVENTS.decode(msg.data)
        except codec.DecodeError as exc:
            log.warning("message_undecodable", subject=msg.subject, kind="reply", error=str(exc))
            _end(inbox, InternalError("An upstream service sent an undecodable reply."))
            return
        if isinstance(event, ResponseChunk):
            if not inbox.admit(event.seq):
                self._out_of_turn(request_id, inbox, event.seq)
                return
            if event.done and inbox.probe is not None:
                inbox.probe.end()
        elif isinstance(event, RequestFailed):
            _end(inbox, from_message(event))
            return
        inbox.put_nowait(event)

    def _out_of_turn(self, request_id: str, inbox: Inbox, seq: int) -> None:
        """Drop a chunk not in turn: a duplicate (a replay), or one past a hole: ask for it."""
        if seq < inbox.next_seq:
            log.debug("chunk_duplicate_dropped", request_id=request_id, seq=seq)
            return
        log.debug("chunk_hole", request_id=request_id, seq=seq, next_seq=inbox.next_seq)
        self._prober.on_hole(request_id, inbox)


def _end(inbox: Inbox, error: ServiceError) -> None:
    """Put the error that ends (or resubmits) the request; stop probing it meanwhile."""
    if inbox.probe is not None:
        inbox.probe.end()
    inbox.put_nowait(error)
