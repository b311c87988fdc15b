"""The gateway's gRPC server (``grpc.aio``), in the HTTP server's process and event loop.

It serves ``inference.GRPCInferenceService`` (``grpc_service.py``), ``grpc.health.v1``
(SERVING once a model has a live worker, NOT_SERVING before and from SIGTERM on) and server
reflection, over the same ``GatewayBus`` as HTTP. Wiring only: started by the app's lifespan
after the bus, stopped (gracefully, up to ``--shutdown-grace-s``) before it.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped]

from services.gateway.bus import GatewayBus
from services.gateway.config import GatewayConfig
from services.gateway.grpc_infer import Inference
from services.gateway.grpc_service import InferenceServicer
from services.gateway.metrics import GatewayMetrics
from services.gateway.relay import Readiness
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
HEALTH_INTERVAL_S = 0.5
"""How often the health status is recomputed (worker cards expire without an event)."""


def server_options(config: GatewayConfig) -> list[tuple[str, int]]:
    """grpc core channel args for the server.

    grpc core has one receive-window knob, the initial stream window
    (``grpc.http2.lookahead_bytes``); its connection window is that target plus what streams
    were granted beyond it, with no arg of its own, and BDP probing (on by default) keeps
    re-sizing both. So either window setting turns probing off and fixes the stream window at
    the larger of the two: each stream may then receive that much, the connection at least that.
    """
    options = [
        # A port in use is an error, not a second listener sharing it.
        ("grpc.so_reuseport", 0),
        ("grpc.max_send_message_length", config.grpc_max_message_size),
        ("grpc.max_receive_message_length", config.grpc_max_message_size),
    ]
    windows = [
        size
        for size in (
            config.grpc_initial_stream_window_size,
            config.grpc_initial_connection_window_size,
        )
        if size is not None
    ]
    if windows:
        options += [("grpc.http2.lookahead_bytes", max(windows)), ("grpc.http2.bdp_probe", 0)]
    return options


def bind_address(host: str, port: int) -> str:
    """``host:port`` as grpc wants it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class GrpcServer:
    """The gRPC listener: ``start()`` binds (raises when the port is taken), ``stop()`` drains."""

    def __init__(
        self,
        config: GatewayConfig,
        bus: GatewayBus,
        readiness: Readiness,
        metrics: GatewayMetrics,
    ) -> None:
        self._config = config
        self.servicer = InferenceServicer(
            Inference(config, bus, readiness), bus, readiness, metrics
        )
        self.port = 0
        """The bound port, once started (``--grpc-port 0`` picks a free one)."""
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return bind_address(self._config.http_host, self.port)

    async def start(self) -> None:
        """Bind and serve; the health status follows the model registry from here on."""
        server = grpc.aio.server(options=server_options(self._config))
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        address = bind_address(self._config.http_host, self._config.grpc_port)
        try:
            self.port = server.add_insecure_port(address)
        except RuntimeError:
            log.error("grpc_bind_failed", address=address, hint="is the port in use?")
            raise
        await self._set_health(is_serving=False)
        await server.start()
        self._server = server
        self._watcher = asyncio.get_running_loop().create_task(self._watch_health())

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING, then stop taking calls and give in-flight ones ``grace_s`` to finish."""
        if self._server is None:
            return
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self._server.stop(grace_s)
        self._server = None
        log.info("grpc_stopped", grpc=self.address)

    async def _watch_health(self) -> None:
        is_serving = False
        while True:
            now_serving = self.servicer.is_ready()
            if now_serving != is_serving:
                is_serving = now_serving
                await self._set_health(is_serving=is_serving)
                log.info("grpc_health", serving=is_serving)
            await asyncio.sleep(HEALTH_INTERVAL_S)

    async def _set_health(self, *, is_serving: bool) -> None:
        assert self._health is not None
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if is_serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE_NAME):
            await self._health.set(service, status)
