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
from shared.bus import connect, wait_for_signal
from shared.errors import InternalError, ServiceError
from shared.messages import Generate
from shared.registry import WorkerDirectory
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

QUEUE_GROUP = "router"


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

    async def start(self) -> None:
        """Load the live workers, then start taking requests."""
        await self._directory.start()
        self._sub = await self._nc.subscribe(
            self._subjects.route, queue=QUEUE_GROUP, cb=self.on_route
        )
        await self._nc.flush()  # the server knows the subscription before we say "started"
        log.info("router_started", mode=self._policy.mode, namespace=self._config.namespace)

    async def stop(self) -> None:
        """Stop taking requests (finishing those already received), then stop watching."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.drain()  # type: ignore[no-untyped-call]
        await self._directory.stop()

    async def on_route(self, msg: Msg) -> None:
        try:
            gen = codec.decode(msg.data, Generate)
        except codec.DecodeError as exc:
            log.warning("bad_message", subject=msg.subject, error=str(exc))
            return
        with bound_contextvars(request_id=gen.request_id):
            try:
                card = select_worker(self._policy, gen, self._directory.live(gen.model))
                routed = msgspec.structs.replace(gen, worker_id=card.worker_id)
                await self._nc.publish(
                    self._subjects.generate(card.worker_id),
                    codec.encode(routed),
                    reply=gen.stream_to,
                )
            except ServiceError as exc:
                log.warning("request_rejected", code=exc.code, error=exc.message)
                await self._fail(gen, exc)
                return
            except Exception:
                log.exception("route_failed")
                await self._fail(gen, InternalError("the router failed to route the request"))
                return
            log.info("request_routed", worker_id=card.worker_id, mode=self._policy.mode)

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
