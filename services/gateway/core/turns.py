"""Stateful Responses turns (decision 030), for every front (HTTP, WebSocket): a turn is opened
with the conversation it continues, and kept once answered.

``begin`` reads the turns ``previous_response_id`` names (the stored chain, or the WebSocket
connection's last turn, ``Recent``, which holds it even when it was not stored) and gives the
turn its response id; ``keep`` takes the finished ``response`` out of the formatter's last bytes
and stores the turn's record before the client gets those bytes, so a next turn sent at once to
any gateway replica finds it. A record whose earlier turns are all stored names them
(``ancestors``); one that continues a turn that was not stored holds the whole conversation
before it in its ``input``, so it never depends on what was not kept.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog

from services.gateway.apis import openai_responses_api as api
from services.gateway.apis.nvext import NO_HEADERS, RoutingHeaders
from services.gateway.apis.stored_turns import (
    RESPONSE_PREFIX,
    PreviousResponseNotFound,
    StoredTurn,
    check_storable,
    conversation,
    final_response,
    input_record,
)
from services.gateway.core.turn_store import TurnStore, read_chain
from shared.errors import ServiceError
from shared.messages import Preprocess

log = structlog.get_logger(__name__)


def new_id(prefix: str) -> str:
    """A fresh id: ``<prefix>_`` and 32 hex digits (unique over any store's lifetime)."""
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class Recent:
    """A WebSocket connection's last turn: its record and the conversation before it."""

    turn: StoredTurn
    history: list[dict[str, Any]]
    """The items before ``turn.input``."""
    ancestors: list[str] | None
    """``turn.ancestors`` when the turn is stored (so a continuation may name it); ``None``
    when it is not."""


@dataclass(slots=True)
class Turn:
    """One Responses turn between ``begin`` and ``keep``."""

    request: api.ResponsesRequest
    response_id: str
    history: list[dict[str, Any]]
    ancestors: list[str] | None
    """The stored turns before it, oldest first; ``None``: one of them is not stored."""
    input: list[dict[str, Any]]
    to_preprocess: Callable[..., Preprocess]
    kept: Recent | None = field(default=None)

    @property
    def is_stored(self) -> bool:
        return api.is_stored(self.request)


class Turns:
    """Opens and keeps turns in ``store``."""

    __slots__ = ("_new_id", "store")

    def __init__(self, store: TurnStore, new_id: Callable[[str], str] = new_id) -> None:
        self.store = store
        self._new_id = new_id

    async def begin(
        self,
        request: api.ResponsesRequest,
        headers: RoutingHeaders = NO_HEADERS,
        recent: Recent | None = None,
    ) -> Turn:
        """The turn ``request`` makes, after the conversation it continues (400 when
        ``previous_response_id`` names no stored turn nor ``recent``'s)."""
        history: list[dict[str, Any]] = []
        ancestors: list[str] | None = []
        previous = request.previous_response_id
        if previous is not None and recent is not None and recent.turn.id == previous:
            history = [*recent.history, *conversation([recent.turn])]
            ancestors = None if recent.ancestors is None else [*recent.ancestors, previous]
        elif previous is not None:
            chain = await read_chain(self.store, previous, PreviousResponseNotFound)
            history = conversation(chain)
            ancestors = [turn.id for turn in chain]
        chat = api.to_chat(request, history)
        record_input = input_record(request.input, self._new_id)
        if api.is_stored(request):
            kept = record_input if ancestors is not None else [*history, *record_input]
            check_storable(kept, self.store.limit_bytes)
        response_id = self._new_id(RESPONSE_PREFIX.rstrip("_"))
        echo = api.echo_fields(request, response_id=response_id, stored=api.is_stored(request))
        return Turn(
            request=request,
            response_id=response_id,
            history=history,
            ancestors=ancestors,
            input=record_input,
            to_preprocess=partial(api.responses_to_preprocess, chat, echo=echo, headers=headers),
        )

    async def keep(self, turn: Turn, data: bytes, *, stream: bool) -> None:
        """Store the finished turn (``data``: the formatter's last bytes), and note it as the
        connection's last (``turn.kept``). A store that cannot be reached is logged: the
        client still gets its answer, and a continuation from it is then a 400."""
        response = final_response(data, stream=stream)
        if response is None:
            log.warning("turn_without_response", response_id=turn.response_id)
            return
        history = turn.history
        if turn.ancestors is None:  # continues what was not stored: keep it whole
            record = StoredTurn(id=turn.response_id, input=[*history, *turn.input])
            history = []
        else:
            record = StoredTurn(id=turn.response_id, input=turn.input, ancestors=turn.ancestors)
        record.response = response
        stored = turn.is_stored
        if stored:
            try:
                await self.store.put(record)
            except ServiceError as exc:
                stored = False
                log.warning("turn_not_stored", response_id=turn.response_id, error=exc.message)
        turn.kept = Recent(record, history, record.ancestors if stored else None)
