"""The gateway's gRPC server, in the HTTP server's process and event loop (``http2/``).

It serves ``inference.GRPCInferenceService`` (``service.py``), ``grpc.health.v1``
(SERVING once a model has a live worker, NOT_SERVING before and from SIGTERM on) and server
reflection, over the same ``GatewayBus`` as HTTP. Wiring only: started by the app's lifespan
after the bus, stopped (gracefully, up to ``--shutdown-grace-s``) before it.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import (  # type: ignore[import-untyped]
    reflection,
    reflection_pb2_grpc,
)

from services.gateway.apis.admission_hints import AdmissionReader
from services.gateway.config import GatewayConfig
from services.gateway.core.admission import Admission
from services.gateway.core.auth import ApiKeys
from services.gateway.core.exchange import Exchanges
from services.gateway.core.metrics import GatewayMetrics
from services.gateway.core.port import GatewayBus
from services.gateway.core.readiness import Readiness
from services.gateway.grpc.http2.calls import CallLimits
from services.gateway.grpc.http2.connection import Http2Settings, StreamReset
from services.gateway.grpc.http2.server import Server
from services.gateway.grpc.infer import Inference
from services.gateway.grpc.service import InferenceServicer
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
HEALTH_INTERVAL_S = 0.5
"""How often the health status is recomputed (worker cards expire without an event)."""


def http2_settings(config: GatewayConfig) -> Http2Settings:
    """The receive windows the server advertises, and its limits."""
    return Http2Settings(
        stream_window=config.grpc_initial_stream_window_size,
        connection_window=config.grpc_initial_connection_window_size,
        max_partial=max(config.grpc_max_connection_buffer_size, config.grpc_max_message_size),
        send_timeout_s=config.send_timeout_s,
        idle_timeout_s=config.grpc_idle_timeout_s,
    )


def bind_address(host: str, port: int) -> str:
    """``host:port`` for logs (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class GrpcServer:
    """The gRPC listener: ``start()`` binds (raises when the port is taken), ``stop()`` drains."""

    def __init__(
        self,
        config: GatewayConfig,
        bus: GatewayBus,
        readiness: Readiness,
        metrics: GatewayMetrics,
        admission: Admission | None = None,
        keys: ApiKeys | None = None,
    ) -> None:
        self._config = config
        self._keys = keys or ApiKeys(())
        exchanges = Exchanges(
            bus,
            first_timeout_s=config.request_timeout_s,
            idle_timeout_s=config.stream_idle_timeout_s,
            client_gone=(StreamReset,),  # a write to a reset stream: the client went away
        )
        policy = config.admission_policy() if config.admission_config is not None else None
        self.servicer = InferenceServicer(
            Inference(exchanges, readiness, AdmissionReader(policy)),
            bus,
            readiness,
            metrics,
            admission,
        )
        self.port = 0
        """The bound port, once started (``--grpc-port 0`` picks a free one)."""
        self._server: Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return bind_address(self._config.http_host, self.port)

    async def start(self) -> None:
        """Bind and serve; the health status follows the model registry from here on."""
        size = self._config.grpc_max_message_size
        server = Server(
            http2_settings(self._config),
            CallLimits(max_receive=size, max_send=size),
            authorize=self._keys.allows_call if self._keys else None,
        )
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            reflection.aio.ReflectionServicer(names), server
        )
        try:
            self.port = await server.start(self._config.http_host, self._config.grpc_port)
        except OSError as exc:
            address = bind_address(self._config.http_host, self._config.grpc_port)
            log.error("grpc_bind_failed", address=address, error=str(exc))
            raise
        self._server = server
        await self._set_health(is_serving=False)
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
