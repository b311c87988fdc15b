"""Encode and decode bus messages: MessagePack via msgspec, one cached decoder per type."""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    """Serialize one message (or record) to MessagePack."""
    return _encoder.encode(message)


@cache
def _decoder(kind: Any) -> msgspec.msgpack.Decoder[Any]:
    return msgspec.msgpack.Decoder(kind)


def decode(data: bytes, kind: type[T]) -> T:
    """Deserialize ``data`` as ``kind`` (a Struct or a union of tagged Structs)."""
    result: T = _decoder(kind).decode(data)  # type: ignore[arg-type]  # types are hashable
    return result


def to_json(message: msgspec.Struct) -> bytes:
    """JSON form of a message, for logs and ``jetserve tap``."""
    return msgspec.json.encode(message)


DecodeError = msgspec.DecodeError
