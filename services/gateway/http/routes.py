"""Litestar routes: ``/v1/models``, ``/health``, ``/live``, ``/metrics``, ``/docs`` (Swagger UI).

Handlers are closures built by ``build_routes`` over their collaborators, so nothing is
injected per request. The two inference endpoints are not here: ``relay.py`` serves them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.handlers import HTTPRouteHandler

from services.gateway.apis import openapi_own as out
from services.gateway.core.bus import GatewayBus
from services.gateway.core.metrics import CONTENT_TYPE, GatewayMetrics
from services.gateway.http.openapi import DOCS_PATH, swagger_page
from services.gateway.http.relay import Readiness
from shared.messages import WORKER_ROLES, WorkerCard

JSON = "application/json"


def model_workers(cards: Iterable[WorkerCard]) -> out.ModelWorkers:
    """``/v1/models``' ``jetserve`` extension of one model from its live workers' cards."""
    workers: dict[str, int] = dict.fromkeys(WORKER_ROLES, 0)
    ranks = 0
    for card in cards:
        workers[card.role] += 1
        ranks += card.dp_size
    return out.ModelWorkers(workers=workers, dp_ranks=ranks)


def build_routes(
    bus: GatewayBus, readiness: Readiness, metrics: GatewayMetrics
) -> list[HTTPRouteHandler]:
    """The gateway's Litestar route handlers, bound to ``bus``, ``readiness`` and ``metrics``."""
    started_at = int(time.time())

    @get("/v1/models", include_in_schema=False)
    async def list_models() -> Response[bytes]:
        data = []
        for model in bus.live_models():
            card = await bus.model_card(model)
            created = card.created if card and card.created else started_at
            workers = model_workers(bus.live_workers(model))
            data.append(out.Model(id=model, created=created, owned_by="jetserve", jetserve=workers))
        return Response(msgspec.json.encode(out.ModelList(data=data)), media_type=JSON)

    @get("/health", include_in_schema=False)
    async def health() -> Response[bytes]:
        models = bus.live_models()
        if readiness.is_shutting_down:
            status, reason = "shutting_down", "shutting_down"
        elif not bus.is_connected:
            status, reason = "unavailable", "nats_disconnected"
        elif not models:
            status, reason = "unavailable", "no_live_model"
        else:
            status, reason = "ok", None
        body: dict[str, Any] = {"status": status, "models": models}
        if reason is not None:
            body["reason"] = reason
        code = 200 if status == "ok" else 503
        return Response(msgspec.json.encode(body), status_code=code, media_type=JSON)

    @get("/live", include_in_schema=False)
    async def live() -> Response[bytes]:
        return Response(b'{"status":"ok"}', media_type=JSON)

    @get("/metrics", include_in_schema=False)
    async def prometheus() -> Response[bytes]:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @get(DOCS_PATH, include_in_schema=False)
    async def docs(request: Request[Any, Any, Any]) -> Response[bytes]:
        return Response(swagger_page(request), media_type="text/html; charset=utf-8")

    return [list_models, health, live, prometheus, docs]
