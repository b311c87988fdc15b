"""Serve the app with uvicorn (uvloop + httptools) and gRPC in the same loop; SIGTERM flips
readiness, then drains. With ``--tls-cert-path`` / ``--tls-key-path`` the HTTP listener serves
HTTPS (uvicorn's ssl options; gRPC stays plaintext)."""

from __future__ import annotations

import math
import signal
import socket
import ssl
import time
from types import FrameType
from typing import Any

import uvicorn

from services.gateway.config import GatewayConfig
from services.gateway.core.bus import NatsBus
from services.gateway.core.metrics import GatewayMetrics
from services.gateway.core.paths import Paths
from services.gateway.core.readiness import Readiness
from services.gateway.core.turn_store import KvTurns
from services.gateway.core.turns import Turns
from services.gateway.http.app import create_app
from shared.lifecycle import settle_heap
from shared.metrics import serve_metrics


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app it is shutting down as soon as a signal arrives."""

    def __init__(
        self, config: uvicorn.Config, readiness: Readiness, drain_delay_s: float = 0.0
    ) -> None:
        super().__init__(config)
        self._readiness = readiness
        self._drain_delay_s = drain_delay_s
        self._stop_at: float | None = None
        """After a SIGTERM with a drain delay: when to stop listening (``time.monotonic()``)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        settle_heap()  # this process is the gateway's own

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self._readiness.is_shutting_down
        self._readiness.begin_shutdown()
        if first and sig == signal.SIGTERM and self._drain_delay_s > 0:
            # Keep listening a while: /health and /live answer 503, so load balancers and
            # orchestrators stop sending; what still arrives is served. on_tick stops later.
            self._stop_at = time.monotonic() + self._drain_delay_s
            return
        self._stop(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self._stop_at is not None and time.monotonic() >= self._stop_at:
            self._stop_at = None
            self._stop(signal.SIGTERM, None)
        return await super().on_tick(counter)

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's exit: stop listening, drain within the grace period, exit 0 on SIGTERM."""
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM and not self.force_exit:
            # A drain is a clean stop: exit 0, not by the signal uvicorn would raise again.
            self._captured_signals.remove(sig)


def build_server(config: GatewayConfig) -> uvicorn.Server:
    """A uvicorn server for the gateway app; ``run()`` it to serve until SIGTERM/SIGINT."""
    tls = tls_options(config)  # first: a bad certificate fails before anything starts
    readiness = Readiness()
    metrics = GatewayMetrics(routes=Paths.of(config).all(), prefix=config.metrics_prefix)
    bus = NatsBus(config, metrics=metrics.base)
    store = KvTurns(
        bus.jetstream,
        bus.subjects.stored_turns_bucket,
        ttl_s=config.responses_store_ttl_s,
        max_bytes=config.responses_store_max_bytes,
        limit_bytes=config.responses_max_stored_bytes,
        max_payload=bus.max_payload,
        replicas=config.js_replicas,
    )
    app = create_app(
        config, bus=bus, readiness=readiness, metrics=metrics, serve_grpc=True, turns=Turns(store)
    )
    # /metrics is served on the HTTP port; --metrics-port adds a separate listener if set.
    serve_metrics(metrics.base, config.metrics_port, prefix=config.metrics_prefix)
    # uvloop and asyncio both set TCP_NODELAY on accepted sockets (checked), so a kept-alive
    # client never waits on a delayed ACK.
    server_config = uvicorn.Config(
        app,
        host=config.http_host,
        port=config.http_port,
        loop="uvloop",
        http="httptools",
        # The Responses API's WebSocket mode; a client message is bounded like a body.
        ws="websockets-sansio",
        ws_max_size=config.max_body_bytes,
        lifespan="on",
        access_log=False,
        log_config=None,
        server_header=False,
        # Nothing reads the client address or scheme; skip uvicorn's X-Forwarded-* middleware.
        proxy_headers=False,
        # On SIGTERM in-flight requests finish within the grace period, then are cut.
        timeout_graceful_shutdown=math.ceil(config.shutdown_grace_s),
        **tls,
    )
    return _Server(server_config, readiness, config.drain_delay_s)


class TlsError(ValueError):
    """The TLS certificate and key cannot serve HTTPS (a start-up error)."""


def tls_options(config: GatewayConfig) -> dict[str, Any]:
    """uvicorn's ssl options for ``config`` (none without TLS), after checking that the
    certificate and key load and belong together, so a bad pair fails at start-up, clearly."""
    cert, key = config.tls_cert_path, config.tls_key_path
    if cert is None or key is None:
        return {}
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise TlsError(
            f"--tls-cert-path {cert} / --tls-key-path {key}: not a PEM certificate and its "
            f"private key ({exc.reason or exc})"
        ) from None
    except OSError as exc:
        raise TlsError(f"--tls-cert-path {cert} / --tls-key-path {key}: {exc}") from None
    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}


def serve(config: GatewayConfig) -> None:
    """Serve HTTP and gRPC until a signal."""
    # A SIGTERMed gateway exits 0 once the lifespan has drained the bus; after SIGINT uvicorn
    # raises the signal again (status 130).
    try:
        server = build_server(config)
    except TlsError as exc:
        raise SystemExit(f"gateway: {exc}") from None
    server.run()
