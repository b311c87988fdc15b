"""Litestar routes of stored Responses turns (decision 030): ``GET`` / ``DELETE
{responses}/{id}``, ``GET {responses}/{id}/input_items``, and ``POST {responses}/compact`` (one
summarizing turn through the usual exchange, non-streaming)."""

from __future__ import annotations

from typing import Any

import msgspec
import structlog
from litestar import Request, Response, delete, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath

from services.gateway.apis import compaction, stored_turns
from services.gateway.apis.openai_responses_api import parse_responses
from services.gateway.apis.stored_turns import (
    PreviousResponseNotFound,
    ResponseNotFound,
    check_response_id,
    conversation,
    final_response,
)
from services.gateway.core.context import current
from services.gateway.core.exchange import Exchanges
from services.gateway.core.paths import Paths
from services.gateway.core.turn_store import read_chain
from services.gateway.core.turns import Turns, new_id
from shared.errors import InternalError

JSON = "application/json"
log = structlog.get_logger(__name__)


def build_turn_routes(
    exchanges: Exchanges, turns: Turns, paths: Paths, *, allow_unknown: bool
) -> list[HTTPRouteHandler]:
    """The stored-turn routes under ``paths.responses``."""
    store = turns.store
    one = f"{paths.responses}/{{response_id:str}}"

    async def chain(response_id: str) -> list[stored_turns.StoredTurn]:
        check_response_id(response_id, "response_id")
        return await read_chain(store, response_id, ResponseNotFound)

    @get(one, include_in_schema=False)
    async def retrieve(response_id: FromPath[str]) -> Response[bytes]:
        check_response_id(response_id, "response_id")
        turn = await store.get(response_id)
        if turn is None or turn.omitted_bytes:
            why = "" if turn is None else stored_turns.omitted_why(turn, store.limit_bytes)
            raise ResponseNotFound(response_id, why)
        return Response(msgspec.json.encode(turn.response), media_type=JSON)

    @delete(one, status_code=200, include_in_schema=False)
    async def forget(response_id: FromPath[str]) -> Response[bytes]:
        check_response_id(response_id, "response_id")
        if not await store.delete(response_id):
            raise ResponseNotFound(response_id)
        log.info("turn_deleted", response_id=response_id)
        return Response(stored_turns.deleted_body(response_id), media_type=JSON)

    @get(f"{one}/input_items", include_in_schema=False)
    async def input_items(
        response_id: FromPath[str], request: Request[Any, Any, Any]
    ) -> Response[bytes]:
        query = stored_turns.list_query(dict(request.query_params))
        turns_ = await chain(response_id)
        items = [*conversation(turns_[:-1]), *turns_[-1].input]
        return Response(stored_turns.input_items_page(items, query), media_type=JSON)

    @post(paths.compact, status_code=200, include_in_schema=False)
    async def compact(request: Request[Any, Any, Any]) -> Response[bytes]:
        parsed = compaction.parse_compact(await request.body(), allow_unknown=allow_unknown)
        await exchanges.bus.check_model(parsed.model)
        history: list[dict[str, Any]] = []
        if parsed.previous_response_id is not None:
            earlier = await read_chain(store, parsed.previous_response_id, PreviousResponseNotFound)
            history = conversation(earlier)
        items = compaction.compacted_items(parsed, history)
        summary_request = parse_responses(
            msgspec.json.encode(compaction.summary_turn(parsed, items))
        )
        turn = await turns.begin(summary_request)
        ctx = current()
        bus_request, envelope = exchanges.addressed(ctx, turn.to_preprocess)
        exchange = await exchanges.submit(ctx, bus_request, envelope)
        _, data = await exchange.relay(await exchange.first())
        response = final_response(data, stream=False)
        if response is None:
            raise InternalError("The summarizing turn gave no response.")
        body = compaction.compacted_body(
            compaction_id=new_id("resp"),
            item_id=new_id,
            created_at=envelope.created,
            items=items,
            summary=compaction.response_text(response),
            usage=response.get("usage"),
        )
        return Response(body, media_type=JSON)

    return [retrieve, forget, input_items, compact]
