"""Litestar routes: ``/v1/models``, ``/health``, ``/live``, ``/metrics``, ``/docs`` (Swagger UI),
``/busy_threshold`` (every router's per-model busy thresholds), and the request/reply inference
routes (embeddings, images, videos).

Handlers are closures built over their collaborators, so nothing is injected per request. The
streaming inference endpoints are not here: ``relay.py`` serves them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import msgspec
import structlog
from litestar import Request, Response, get, post
from litestar.handlers import HTTPRouteHandler

from services.gateway.apis import busy_threshold, embeddings, media
from services.gateway.apis import openapi_shapes as out
from services.gateway.core import asks
from services.gateway.core.context import current
from services.gateway.core.exchange import Exchanges
from services.gateway.core.metrics import CONTENT_TYPE, GatewayMetrics
from services.gateway.core.paths import Paths
from services.gateway.core.port import GatewayBus
from services.gateway.core.readiness import Readiness
from services.gateway.http.openapi import DOCS_PATH, swagger_page
from shared.errors import ModelNotFound
from shared.messages import WORKER_ROLES, WorkerCard

JSON = "application/json"
log = structlog.get_logger(__name__)


def model_workers(cards: Iterable[WorkerCard]) -> out.ModelWorkers:
    """``/v1/models``' ``jetserve`` extension of one model from its live workers' cards."""
    workers: dict[str, int] = dict.fromkeys(WORKER_ROLES, 0)
    ranks = 0
    for card in cards:
        workers[card.role] += 1
        ranks += card.dp_size
    return out.ModelWorkers(workers=workers, dp_ranks=ranks)


def build_routes(
    bus: GatewayBus, readiness: Readiness, metrics: GatewayMetrics, paths: Paths
) -> list[HTTPRouteHandler]:
    """The gateway's Litestar route handlers, bound to ``bus``, ``readiness`` and ``metrics``."""
    started_at = int(time.time())

    @get(paths.models, include_in_schema=False)
    async def list_models() -> Response[bytes]:
        data = []
        for model in bus.live_models():
            card = await bus.model_card(model)
            created = card.created if card and card.created else started_at
            workers = model_workers(bus.live_workers(model))
            data.append(out.Model(id=model, created=created, owned_by="jetserve", jetserve=workers))
        return Response(msgspec.json.encode(out.ModelList(data=data)), media_type=JSON)

    @get(paths.health, include_in_schema=False)
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

    @get(paths.live, include_in_schema=False)
    async def live() -> Response[bytes]:
        if readiness.is_shutting_down:  # draining: orchestrators stop counting on this process
            return Response(b'{"status":"draining"}', status_code=503, media_type=JSON)
        return Response(b'{"status":"ok"}', media_type=JSON)

    @get(paths.metrics, include_in_schema=False)
    async def prometheus() -> Response[bytes]:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @get(DOCS_PATH, include_in_schema=False)
    async def docs(request: Request[Any, Any, Any]) -> Response[bytes]:
        return Response(swagger_page(request), media_type="text/html; charset=utf-8")

    @post(paths.busy_threshold, status_code=200, include_in_schema=False)
    async def set_busy_threshold(request: Request[Any, Any, Any]) -> Response[bytes]:
        parsed = busy_threshold.parse(await request.body())
        if not parsed.is_setting:
            found = next(iter(await bus.busy_thresholds(parsed.model)), None)
            return Response(busy_threshold.answer(parsed.model, found), media_type=JSON)
        if not bus.is_live(parsed.model) and await bus.model_card(parsed.model) is None:
            raise ModelNotFound(parsed.model)  # as Dynamo: only a model it knows
        stored = await bus.set_busy_thresholds(parsed.to_message())
        log.info("busy_thresholds_set", model=stored.model, revision=stored.revision)
        return Response(busy_threshold.answer(parsed.model, stored), media_type=JSON)

    @get(paths.busy_threshold, include_in_schema=False)
    async def list_busy_thresholds() -> Response[bytes]:
        return Response(busy_threshold.listing(await bus.busy_thresholds()), media_type=JSON)

    return [list_models, health, live, prometheus, docs, set_busy_threshold, list_busy_thresholds]


def build_ask_routes(
    exchanges: Exchanges, paths: Paths, *, allow_unknown: bool
) -> list[HTTPRouteHandler]:
    """``/v1/embeddings``, ``/v1/images/generations`` and ``/v1/videos/generations``: parse
    (``apis/``), then one request/reply exchange (``core/asks.py``)."""

    @post(paths.embeddings, status_code=200, include_in_schema=False)
    async def embed(request: Request[Any, Any, Any]) -> Response[bytes]:
        parsed = embeddings.parse(await request.body(), allow_unknown=allow_unknown)
        envelope = exchanges.envelope(current())
        return Response(await asks.embed(exchanges, parsed, envelope), media_type=JSON)

    @post(paths.images, status_code=200, include_in_schema=False)
    async def images(request: Request[Any, Any, Any]) -> Response[bytes]:
        parsed = media.parse_image(await request.body(), allow_unknown=allow_unknown)
        envelope = exchanges.envelope(current())
        message = media.image_message(
            parsed, request_id=envelope.request_id, deadline_ms=envelope.deadline_ms
        )
        result = await asks.generate_media(exchanges, message, envelope)
        size = (message.width, message.height)
        body = media.image_body(result, parsed, created=envelope.created, size=size)
        return Response(body, media_type=JSON)

    @post(paths.videos, status_code=200, include_in_schema=False)
    async def videos(request: Request[Any, Any, Any]) -> Response[bytes]:
        parsed = media.parse_video(await request.body(), allow_unknown=allow_unknown)
        envelope = exchanges.envelope(current())
        message = media.video_message(
            parsed, request_id=envelope.request_id, deadline_ms=envelope.deadline_ms
        )
        started = time.monotonic()
        result = await asks.generate_media(exchanges, message, envelope)
        body = media.video_body(
            result,
            parsed,
            video_id=f"video_{envelope.request_id}",
            created=envelope.created,
            inference_time_s=time.monotonic() - started,
        )
        return Response(body, media_type=JSON)

    return [embed, images, videos]
