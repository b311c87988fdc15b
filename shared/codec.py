"""Encode and decode bus messages: MessagePack via msgspec, one cached decoder per type.

``decoder(kind)`` gives the typed decoder of a message class; the two unions a service reads
from one subject have typed decoders of their own (``WORKER_EVENTS``, ``GATEWAY_EVENTS``), so
no caller needs a ``type: ignore`` to decode them.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from shared.messages import AdmissionRecord, GatewayEvent, PrefillAnswer, WorkerEvent

T = TypeVar("T")

Decoder = msgspec.msgpack.Decoder
DecodeError = msgspec.DecodeError

_encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    """Serialize one message (or record) to MessagePack."""
    return _encoder.encode(message)


_decoders: dict[Any, Decoder[Any]] = {}


def decoder(kind: type[T]) -> Decoder[T]:
    """The (cached) decoder of message class ``kind``."""
    found: Decoder[T] | None = _decoders.get(kind)
    if found is None:
        found = _decoders[kind] = Decoder(kind)
    return found


def decode(data: bytes, kind: type[T]) -> T:
    """Deserialize ``data`` as ``kind`` (a Struct class)."""
    return decoder(kind).decode(data)


WORKER_EVENTS: Decoder[WorkerEvent] = Decoder(WorkerEvent)
"""What a formatter's stream subject carries: ``TokenBatch``, ``RequestFailed`` or
``RouteChoice``."""
PREFILL_ANSWERS: Decoder[PrefillAnswer] = Decoder(PrefillAnswer)
"""What a router's prefill-result subject carries: ``PrefillResult`` or ``RequestFailed``."""
GATEWAY_EVENTS: Decoder[GatewayEvent] = Decoder(GatewayEvent)
"""What a gateway's reply subject carries: ``ResponseChunk``, ``RequestFailed``
(or ``TensorResult``)."""
ADMISSION_RECORDS: Decoder[AdmissionRecord] = Decoder(AdmissionRecord)
"""What the admission stream carries: ``AdmissionServed`` or ``AdmissionBacklog``."""
