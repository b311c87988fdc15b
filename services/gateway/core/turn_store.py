"""Stored Responses turns (decision 030): a JetStream KV bucket that every gateway replica reads
and writes, so any replica continues any conversation and a restart loses nothing.

The bucket (``Subjects.stored_turns_bucket``) ages a record out after
``--responses-store-ttl-s`` and holds at most ``--responses-store-max-bytes``: when full, the
oldest records go first (discard ``old``, set on the bucket's stream when it is opened). One
record is at most ``--responses-max-stored-bytes`` (and never over the server's
``max_payload``); a larger one is kept as a marker that says so (``StoredTurn.omitted_bytes``).
``MemoryTurns`` keeps them in this process only, for a gateway built without NATS (unit tests).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import msgspec
import structlog
from nats.errors import Error as NatsError
from nats.js.api import DiscardPolicy
from nats.js.client import KV_STREAM_TEMPLATE, JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError
from nats.js.kv import KeyValue

from services.gateway.apis.stored_turns import StoredTurn, omitted_why
from shared.errors import ServiceError, ServiceUnavailable
from shared.registry.jetstream import open_kv

log = structlog.get_logger(__name__)
T = TypeVar("T")

PAYLOAD_MARGIN = 4096
"""Room for a message's subject and headers under the server's ``max_payload``."""
MEMORY_MAX_TURNS = 10_000
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(StoredTurn)


class TurnStore(Protocol):
    """Where stored turns live."""

    @property
    def limit_bytes(self) -> int:
        """The largest record kept."""
        ...

    async def get(self, response_id: str) -> StoredTurn | None: ...

    async def put(self, turn: StoredTurn) -> None: ...

    async def delete(self, response_id: str) -> bool: ...


def bounded(turn: StoredTurn, limit_bytes: int) -> bytes:
    """``turn`` encoded, or the marker that stands for it when it is over ``limit_bytes``."""
    data = _ENCODER.encode(turn)
    if len(data) <= limit_bytes:
        return data
    return _ENCODER.encode(StoredTurn(id=turn.id, omitted_bytes=len(data)))


async def read_chain(
    store: TurnStore, response_id: str, missing: Callable[[str, str], ServiceError]
) -> list[StoredTurn]:
    """The stored turns a conversation ending with ``response_id`` is made of, oldest first
    (its ancestors read at once); ``missing(id, why)`` is raised when one is not stored."""
    head = await store.get(response_id)
    if head is None or head.omitted_bytes:
        why = "" if head is None else omitted_why(head, store.limit_bytes)
        raise missing(response_id, why)
    earlier: Sequence[StoredTurn | None] = await asyncio.gather(
        *(store.get(ancestor) for ancestor in head.ancestors)
    )
    turns: list[StoredTurn] = []
    for ancestor, turn in zip(head.ancestors, earlier, strict=True):
        if turn is None or turn.omitted_bytes:
            why = f" Its earlier turn '{ancestor}' is no longer stored."
            raise missing(response_id, why)
        turns.append(turn)
    turns.append(head)
    return turns


class KvTurns:
    """``TurnStore`` on a JetStream KV bucket, opened (and created) on first use."""

    __slots__ = ("_bucket", "_jetstream", "_kv", "_limit", "_lock", "_max_bytes", "_max_payload",
                 "_replicas", "_ttl_s")  # fmt: skip

    def __init__(
        self,
        jetstream: Callable[[], JetStreamContext],
        bucket: str,
        *,
        ttl_s: float,
        max_bytes: int,
        limit_bytes: int,
        max_payload: Callable[[], int] | None = None,
        replicas: int = 1,
    ) -> None:
        self._jetstream = jetstream
        self._bucket = bucket
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes
        self._limit = limit_bytes
        self._replicas = replicas
        self._max_payload = max_payload
        """The server's largest message (once connected): a record stays under it."""
        self._kv: KeyValue | None = None
        self._lock = asyncio.Lock()

    @property
    def limit_bytes(self) -> int:
        return self._limit

    async def get(self, response_id: str) -> StoredTurn | None:
        kv = await self._open()
        try:
            entry = await _unavailable_on_error(kv.get(response_id), "read")
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return _DECODER.decode(entry.value or b"")

    async def put(self, turn: StoredTurn) -> None:
        kv = await self._open()
        await _unavailable_on_error(kv.put(turn.id, bounded(turn, self._limit)), "write")

    async def delete(self, response_id: str) -> bool:
        if await self.get(response_id) is None:
            return False
        kv = await self._open()
        await _unavailable_on_error(kv.delete(response_id), "write")
        return True

    async def _open(self) -> KeyValue:
        if self._kv is not None:
            return self._kv
        async with self._lock:
            if self._kv is None:
                self._kv = await _unavailable_on_error(self._create(), "open")
        return self._kv

    async def _create(self) -> KeyValue:
        """Open the bucket (creating it), then bound its stream: total bytes, oldest first."""
        js = self._jetstream()
        if self._max_payload is not None:
            self._limit = min(self._limit, self._max_payload() - PAYLOAD_MARGIN)
        kv = await open_kv(js, self._bucket, self._ttl_s, replicas=self._replicas, retry_s=5.0)
        stream = KV_STREAM_TEMPLATE.format(bucket=self._bucket)
        info = await js.stream_info(stream)
        config = info.config
        if config.max_bytes != self._max_bytes or config.discard != DiscardPolicy.OLD:
            await js.update_stream(
                config.evolve(max_bytes=self._max_bytes, discard=DiscardPolicy.OLD)
            )
        log.info(
            "turn_store_opened",
            bucket=self._bucket,
            ttl_s=self._ttl_s,
            max_bytes=self._max_bytes,
            limit_bytes=self._limit,
        )
        return kv


async def _unavailable_on_error(op: Awaitable[T], what: str) -> T:
    """``await op``; a NATS failure is a 503 that says the store cannot be reached."""
    try:
        return await op
    except (KeyNotFoundError, KeyDeletedError):
        raise
    except (NatsError, TimeoutError) as exc:
        log.warning("turn_store_failed", what=what, error=repr(exc))
        raise ServiceUnavailable(
            f"The response store cannot be reached ({what}): {exc or type(exc).__name__}"
        ) from exc


class MemoryTurns:
    """``TurnStore`` in this process only (the most recent ``max_turns``)."""

    __slots__ = ("_limit", "_max_turns", "_turns")

    def __init__(self, limit_bytes: int = 1_000_000, max_turns: int = MEMORY_MAX_TURNS) -> None:
        self._limit = limit_bytes
        self._max_turns = max_turns
        self._turns: OrderedDict[str, bytes] = OrderedDict()

    @property
    def limit_bytes(self) -> int:
        return self._limit

    async def get(self, response_id: str) -> StoredTurn | None:
        data = self._turns.get(response_id)
        return None if data is None else _DECODER.decode(data)

    async def put(self, turn: StoredTurn) -> None:
        self._turns[turn.id] = bounded(turn, self._limit)
        while len(self._turns) > self._max_turns:
            self._turns.popitem(last=False)

    async def delete(self, response_id: str) -> bool:
        return self._turns.pop(response_id, None) is not None
