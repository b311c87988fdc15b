"""Routing ``EmbedTokens``: the routers' queue group picks a live worker of the model.

Embedding requests are routed like any request but without KV scoring (pooling keeps no cache
to reuse): the least loaded live worker by its latest fresh load report (``active + waiting``),
round robin among equals, so workers that report nothing (the mock embedder answers at once)
take turns. Workers lost by this router's probes are left out (``Router.live``). A worker gone
since its last heartbeat bounces the request ("no responders"), which is sent to another one,
up to ``MAX_ATTEMPTS`` workers; then, or with no live worker at all, the gateway gets a 503.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from structlog.contextvars import bound_contextvars

from services.router.load import WorkerReports
from shared import codec
from shared.bounce import Bounces
from shared.bus import drain_subscription
from shared.errors import InternalError, NoWorkerAvailable, ServiceError
from shared.handlers import Boundary
from shared.messages import EmbedTokens, WorkerCard
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

QUEUE_GROUP = "router"
MAX_ATTEMPTS = 3

Attempt = tuple[EmbedTokens, tuple[str, ...]]
"""A forwarded request and the workers tried so far."""


def choose(live: Sequence[WorkerCard], reports: WorkerReports, now: float, turn: int) -> WorkerCard:
    """The least loaded of ``live`` (never empty); the ``turn``-th in id order among equals."""

    def load(card: WorkerCard) -> int:
        report = reports.fresh(card.worker_id, now)
        return 0 if report is None else report.active + report.waiting

    loads = {card.worker_id: load(card) for card in live}
    low = min(loads.values())
    equals = sorted(w for w, n in loads.items() if n == low)
    chosen = equals[turn % len(equals)]
    return next(card for card in live if card.worker_id == chosen)


def _reply_to(req: EmbedTokens) -> str:
    return req.reply_to


class EmbedRouting:
    """One router replica's ``EmbedTokens`` subscription, turns per model and bounces."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        boundary: Boundary,
        live: Callable[[str], Sequence[WorkerCard]],
        reports: WorkerReports,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._boundary = boundary
        self._live = live
        self._reports = reports
        self._clock = clock
        self._turns: dict[str, int] = {}
        self._bounces: Bounces[Attempt] = Bounces(nc, subjects, self._on_worker_missing)
        self._sub: Subscription | None = None

    async def start(self) -> None:
        """Join the ``router`` queue group on ``subjects.embed_route``."""
        await self._bounces.start()
        on_embed = self._boundary.handler(
            codec.decoder(EmbedTokens), "embed", self.on_embed, reply_to=_reply_to
        )
        self._sub = await self._nc.subscribe(
            self._subjects.embed_route, queue=QUEUE_GROUP, cb=on_embed
        )

    async def stop(self) -> None:
        """Stop taking requests (those already received are forwarded)."""
        if self._sub is not None:
            await drain_subscription(self._sub)
            self._sub = None
        await self._bounces.stop()

    async def on_embed(self, req: EmbedTokens) -> None:
        """Send ``req`` to a worker; a failure goes to the gateway (``req.reply_to``)."""
        await self._route(req, ())

    async def _route(self, req: EmbedTokens, tried: tuple[str, ...]) -> None:
        live = [c for c in self._live(req.model) if c.worker_id not in tried]
        if not live:
            raise NoWorkerAvailable(f"no live worker serves model {req.model}", retry_after_s=1.0)
        turn = self._turns.get(req.model, 0)
        self._turns[req.model] = turn + 1
        worker_id = choose(live, self._reports, self._clock(), turn).worker_id
        routed = msgspec.structs.replace(req, worker_id=worker_id)
        reply = self._bounces.reply_for(req.request_id, (req, (*tried, worker_id)))
        subject = self._subjects.embed_worker(worker_id)
        await self._nc.publish(subject, codec.encode(routed), reply=reply)
        log.debug("embed_routed", worker_id=worker_id, inputs=len(req.token_ids), retry=len(tried))

    async def _on_worker_missing(self, request_id: str, attempt: Attempt, subject: str) -> None:
        """A bounce from a vanished worker: try another one, or fail the request."""
        req, tried = attempt
        with bound_contextvars(request_id=request_id):
            log.warning("worker_unreachable", worker_id=tried[-1], subject=subject)
            try:
                if len(tried) >= MAX_ATTEMPTS:
                    raise NoWorkerAvailable(f"worker {tried[-1]} is unreachable")
                await self._route(req, tried)
            except ServiceError as exc:
                await self._boundary.fail(req.reply_to, request_id, exc)
            except Exception:  # outside any handler, so this is the boundary: log once, 500
                log.exception("request_crashed", kind="embed_reroute")
                failure = InternalError("the router failed to route the request")
                await self._boundary.publish_failure(req.reply_to, failure.to_message(request_id))
