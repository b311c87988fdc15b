"""Litestar routes: ``/v1/models``, ``/health``, ``/live``, ``/metrics``, ``/docs`` (Swagger UI),
``/busy_threshold`` (every router's per-model busy thresholds), and the request/reply inference
routes (embeddings, images, videos).

Handlers are closures built over their collaborators, so nothing is injected per request. The
streaming inference endpoints are not here: ``relay.py`` serves them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from typing import Any

import msgspec
import structlog
from litestar import Request, Response, get, post
from litestar.handlers import HTTPRouteHandler

from services.gateway.apis import busy_threshold, embeddings, lora_admin, media
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
from shared.messages import (
    WORKER_ROLES,
    LoadLoraAdapter,
    LoraAdapterAnswer,
    LoraCommand,
    UnloadLoraAdapter,
    WorkerCard,
)

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
        live = {model: bus.live_workers(model) for model in bus.live_models()}
        for model, cards in live.items():
            card = await bus.model_card(model)
            created = card.created if card and card.created else started_at
            workers = model_workers(cards)
            data.append(out.Model(id=model, created=created, owned_by="jetserve", jetserve=workers))
            for adapter in lora_admin.adapters_of(cards).values():  # vLLM lists each with parent
                holders = model_workers(c for c in cards if c.worker_id in adapter.workers)
                data.append(
                    out.Model(
                        id=adapter.name,
                        created=created,
                        owned_by="jetserve",
                        root=adapter.path,
                        parent=adapter.parent,
                        jetserve=holders,
                    )
                )
        return Response(msgspec.json.encode(out.ModelList(data=data)), media_type=JSON)

    @post(paths.load_lora_adapter, status_code=200, include_in_schema=False)
    async def load_lora_adapter(request: Request[Any, Any, Any]) -> Response[str]:
        body = lora_admin.parse_load(await request.body())
        cards = lora_admin.targets(body.model, body.worker_ids, _live(bus))
        command = LoadLoraAdapter(
            request_id=uuid.uuid4().hex,
            lora_name=body.lora_name,
            lora_path=body.lora_path,
            requested_by="gateway",
        )
        answers = await _each(bus, cards, command)
        text = lora_admin.load_outcome(body.lora_name, answers)
        await _seen(bus, body.lora_name, answers, held=True)
        log.info("lora_adapter_loaded", lora_name=body.lora_name, workers=len(answers))
        return Response(text, media_type="text/plain")

    @post(paths.unload_lora_adapter, status_code=200, include_in_schema=False)
    async def unload_lora_adapter(request: Request[Any, Any, Any]) -> Response[str]:
        body = lora_admin.parse_unload(await request.body())
        cards = lora_admin.targets(body.model, body.worker_ids, _live(bus))
        command = UnloadLoraAdapter(
            request_id=uuid.uuid4().hex, lora_name=body.lora_name, requested_by="gateway"
        )
        answers = await _each(bus, cards, command)
        text = lora_admin.unload_outcome(body.lora_name, answers)
        await _seen(bus, body.lora_name, answers, held=False)
        log.info("lora_adapter_unloaded", lora_name=body.lora_name, workers=len(answers))
        return Response(text, media_type="text/plain")

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

    return [
        list_models,
        health,
        live,
        prometheus,
        docs,
        set_busy_threshold,
        list_busy_thresholds,
        load_lora_adapter,
        unload_lora_adapter,
    ]


LORA_COMMAND_TIMEOUT_S = 30.0
"""A worker's answer to a load (which may read the adapter's weights) must come within this."""
LORA_SEEN_WITHIN_S = 2.0
"""How long an admin answer waits for this gateway's registry view to show the change."""


async def _seen(
    bus: GatewayBus, name: str, answers: list[LoraAdapterAnswer], *, held: bool
) -> None:
    """Wait (bounded) until this gateway's view of the changed workers' cards shows the change,
    so the client's next request here finds the adapter (or does not)."""
    changed = {a.worker_id for a in answers if a.changed}
    deadline = time.monotonic() + LORA_SEEN_WITHIN_S
    while time.monotonic() < deadline:
        cards = [c for cards in _live(bus).values() for c in cards if c.worker_id in changed]
        if all(any(a.name == name for a in c.loras) == held for c in cards):
            return
        await asyncio.sleep(0.01)
    log.warning("lora_change_not_seen", lora_name=name)


def _live(bus: GatewayBus) -> dict[str, list[WorkerCard]]:
    return {model: bus.live_workers(model) for model in bus.live_models()}


async def _each(
    bus: GatewayBus, cards: list[WorkerCard], command: LoraCommand
) -> list[LoraAdapterAnswer]:
    """Send ``command`` to every worker of ``cards`` at once; their answers, in order."""
    asks = (bus.lora_command(c.worker_id, command, LORA_COMMAND_TIMEOUT_S) for c in cards)
    return list(await asyncio.gather(*asks))


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
