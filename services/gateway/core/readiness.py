"""Whether the gateway wants new work: one flag both fronts read, flipped once on SIGTERM."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Readiness:
    """Whether the gateway wants new work; flipped once on SIGTERM. Draining, it says so on
    ``/health`` and gRPC readiness (load balancers stop sending) and closes its listeners; an
    HTTP request that still reaches it is served within the grace period, a new gRPC call on a
    kept connection is refused UNAVAILABLE (as after a GOAWAY; gRPC clients retry it)."""

    is_shutting_down: bool = False

    def begin_shutdown(self) -> None:
        if not self.is_shutting_down:
            self.is_shutting_down = True
            log.info("shutdown_started")
