"""One lifecycle for every bus service: connect, build, start, serve until a signal, stop, drain.

``serving`` is an ``AsyncExitStack``: whatever was set up is undone in reverse order, also when
start-up fails half way. Once started it tells a supervisor so (``shared.notify``). A service
that defines ``async def on_bus_back(self)`` has it awaited each time its NATS connection comes
back. ``run_service`` serves until SIGINT/SIGTERM (or ``stop``);
``service_main`` is a service's whole ``python -m services.<name>`` entry point.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Protocol, TypeVar

import nats.errors
import structlog
from nats.aio.client import Client

from shared.bus import connect, run, stopped_by_signals
from shared.bus_permissions import inbox_prefix
from shared.config import CommonConfig
from shared.logging import configure_logging
from shared.metrics import ServiceMetrics, serve_metrics
from shared.notify import notify_ready

log = structlog.get_logger(__name__)


class Service(Protocol):
    """What ``serving`` needs of a service: metrics to expose, and start/stop."""

    @property
    def service_metrics(self) -> ServiceMetrics: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Service)
C = TypeVar("C", bound=CommonConfig)


@asynccontextmanager
async def serving(
    config: CommonConfig, name: str, build: Callable[[Client], S], *, settle: bool = False
) -> AsyncIterator[S]:
    """Connect, build the service on the connection, start it; stop and drain on the way out.
    ``settle``: the process is this service's own (``service_main``): ``settle_heap`` once
    started."""
    built: list[S] = []  # the connection exists before the service: its reconnect hook looks here

    async def on_back() -> None:
        for service in built:
            await _bus_back(service)

    async with AsyncExitStack() as stack:
        nc = await connect(
            config.nats_url,
            name=f"jetserve-{name}",
            on_back=on_back,
            inbox_prefix=inbox_prefix(name),
            no_echo=config.NO_ECHO,
            **config.nats_auth().connect_options(),
        )
        stack.push_async_callback(_drain, nc)
        service = build(nc)
        built.append(service)
        serve_metrics(service.service_metrics, config.metrics_port, prefix=config.metrics_prefix)
        await service.start()
        stack.push_async_callback(_stop, service, name)
        if settle:
            settle_heap()
        log.info("service_started", namespace=config.namespace)
        notify_ready()
        yield service


def settle_heap() -> None:
    """Once started: collect the start-up garbage and move what is left (modules, tokenizers,
    caches) out of the collector's sight (``gc.freeze``), so the collections that requests
    cause walk only the objects of requests."""
    gc.collect()
    gc.freeze()


async def run_service(
    config: CommonConfig,
    name: str,
    build: Callable[[Client], Service],
    *,
    stop: asyncio.Event | None = None,
    settle: bool = False,
) -> None:
    """Serve until SIGINT/SIGTERM (or ``stop`` is set), then shut down gracefully (a signal
    during start-up too: once started)."""
    with stopped_by_signals(stop or asyncio.Event()) as stopping:
        async with serving(config, name, build, settle=settle):
            await stopping.wait()
            log.info("shutdown_started")


def service_main(
    config_type: type[C],
    build: Callable[[C, Client], Service],
    argv: list[str] | None = None,
    *,
    preflight: Callable[[C], str | None] | None = None,
) -> None:
    """Parse the command line, set up logging, and serve until a signal (on uvloop).

    ``preflight``: what makes this configuration unable to run here (a missing package, say),
    as one line for the user; the process then exits (status 1) before connecting."""
    config = config_type.from_cli(argv)
    name = config.SERVICE
    problem = preflight(config) if preflight is not None else None
    if problem:
        sys.exit(f"python -m services.{name}: {problem}")
    configure_logging(service=name, level=config.log_level, fmt=config.log_format)
    run(lambda: run_service(config, name, lambda nc: build(config, nc), settle=True))


async def _bus_back(service: Service) -> None:
    """Await the service's ``on_bus_back``, if it has one; a failure is logged, not raised into
    nats-py's reconnect loop."""
    hook: Callable[[], Awaitable[None]] | None = getattr(service, "on_bus_back", None)
    if hook is None:
        return
    try:
        await hook()
    except Exception:  # the hook's own boundary: log once, the connection goes on
        log.exception("bus_back_hook_crashed")


async def _stop(service: Service, name: str) -> None:
    await service.stop()
    log.info("service_stopped")


async def _drain(nc: Client) -> None:
    if nc.is_closed:
        return
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        await nc.drain()
