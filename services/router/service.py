"""Router wiring: ``route`` subscription (queue group) → policy → publish to the chosen worker."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import bound_contextvars

from services.router.config import RouterConfig
from services.router.policy import Policy, build_policy, select_worker
from shared import codec
from shared.bounce import Bounces
from shared.bus import barrier, connect, wait_for_signal
from shared.errors import InternalError, NoWorkerAvailable, ServiceError
from shared.messages import Generate
from shared.registry import WorkerDirectory
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

QUEUE_GROUP = "router"
MAX_ATTEMPTS = 3

Attempt = tuple[Generate, tuple[str, ...]]
"""A forwarded request and the workers tried so far."""


class Router:
    """One router replica on an open NATS connection."""

    def __init__(
        self,
        config: RouterConfig,
        nc: Client,
        *,
        policy: Policy | None = None,
        directory: WorkerDirectory | None = None,
    ) -> None:
        self._config = config
        self._nc = nc
        self._subjects = Subjects(config.namespace)
        self._policy = policy or build_policy(config.router_mode, seed=config.seed)
        self._directory = directory or WorkerDirectory(
            nc.jetstream(), self._subjects, ttl_s=config.worker_ttl_s
        )
        self._sub: Subscription | None = None
        self._bounces: Bounces[Attempt] = Bounces(nc, self._subjects, self._on_worker_missing)

    async def start(self) -> None:
        """Load the live workers, then start taking requests."""
        await self._directory.start()
        await self._bounces.start()
        self._sub = await self._nc.subscribe(
            self._subjects.route, queue=QUEUE_GROUP, cb=self.on_route
        )
        await barrier(self._nc)  # the server knows the subscription before we say "started"
        log.info("router_started", mode=self._policy.mode, namespace=self._config.namespace)

    async def stop(self) -> None:
        """Stop taking requests (finishing those already received), then stop watching."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.drain()  # type: ignore[no-untyped-call]
        await self._bounces.stop()
        await self._directory.stop()

    async def on_route(self, msg: Msg) -> None:
        try:
            gen = codec.decode(msg.data, Generate)
        except codec.DecodeError as exc:
            log.warning("bad_message", subject=msg.subject, error=str(exc))
            return
        with bound_contextvars(request_id=gen.request_id):
            await self._route(gen, ())

    async def _route(self, gen: Generate, tried: tuple[str, ...]) -> None:
        """Send ``gen`` to a live worker not in ``tried``; failures go to the formatter."""
        try:
            live = [c for c in self._directory.live(gen.model) if c.worker_id not in tried]
            card = select_worker(self._policy, gen, live)
            routed = msgspec.structs.replace(gen, worker_id=card.worker_id)
            # A worker gone since its last heartbeat bounces this back: retry another one.
            reply = self._bounces.reply_for(gen.request_id, (gen, (*tried, card.worker_id)))
            await self._nc.publish(
                self._subjects.generate(card.worker_id), codec.encode(routed), reply=reply
            )
        except ServiceError as exc:
            log.warning("request_rejected", code=exc.code, error=exc.message)
            await self._fail(gen, exc)
            return
        except Exception:  # the handler boundary: log once, tell the client
            log.exception("route_failed")
            await self._fail(gen, InternalError("the router failed to route the request"))
            return
        log.info(
            "request_routed", worker_id=card.worker_id, mode=self._policy.mode, retry=len(tried)
        )

    async def _on_worker_missing(self, request_id: str, attempt: Attempt, subject: str) -> None:
        gen, tried = attempt
        with bound_contextvars(request_id=request_id):
            log.warning("worker_unreachable", worker_id=tried[-1], subject=subject)
            if gen.worker_id is not None or len(tried) >= MAX_ATTEMPTS:
                await self._fail(gen, NoWorkerAvailable(f"worker {tried[-1]} is unreachable"))
                return
            await self._route(gen, tried)

    async def _fail(self, gen: Generate, exc: ServiceError) -> None:
        await self._nc.publish(gen.stream_to, codec.encode(exc.to_message(gen.request_id)))


async def serve(config: RouterConfig, stop: asyncio.Event | None = None) -> None:
    """Run one router until SIGINT/SIGTERM (or ``stop``), then drain."""
    nc = await connect(config.nats_url, name="jetserve-router")
    router = Router(config, nc)
    try:
        await router.start()
        await wait_for_signal(stop)
        log.info("shutdown_started")
        await router.stop()
    finally:
        await nc.drain()
