"""What ``jetserve tap`` prints: one JSON line per bus message. Pure: no I/O, no clock.

A message is decoded with the shared codec against the tagged union of every message type in
``shared.messages`` (found by introspection, so new messages show up without changes here);
KV-bucket records by their bucket; anything else as JSON when it parses, else as base64 with the
reason. Bytes fields (``ResponseChunk.data``) are shown as UTF-8 text when they decode.

Subject helpers (NATS wildcard matching, subset and overlap) and ``--since`` parsing live here too.
"""

from __future__ import annotations

import base64
import inspect
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import msgspec

from shared import codec, messages
from shared.subjects import VERSION

LINE_ENCODER = msgspec.json.Encoder()

STATUS_HEADER = "Status"
OBJECT_CHUNK_NOTE = "object-store chunk (not decoded; --raw shows its bytes)"


# --- decoding ------------------------------------------------------------------------------------


@cache
def message_union() -> Any:
    """The union of every concrete tagged Struct in ``shared.messages`` (bases left out)."""
    tagged = [
        cls
        for _, cls in inspect.getmembers(messages, inspect.isclass)
        if issubclass(cls, msgspec.Struct)
        and cls.__module__ == messages.__name__
        and cls.__struct_config__.tag is not None
    ]
    concrete = [c for c in tagged if not any(o is not c and issubclass(o, c) for o in tagged)]
    union: Any = concrete[0]
    for cls in concrete[1:]:
        union = union | cls
    return union


_RECORDS: tuple[type[msgspec.Struct], ...] = (messages.WorkerCard, messages.ModelCard)
"""Untagged durable records, tried by shape when the tagged union does not fit."""


def to_builtins(value: Any, *, tag: bool = True) -> Any:
    """JSON-ready form of a decoded value; bytes as UTF-8 text, else ``{"base64": ...}``.

    Nested tagged Structs (the events of a ``KvEventBatch``) keep their ``type``; ``tag=False``
    leaves it out of the top level, where the line already names the type.
    """
    if isinstance(value, msgspec.Struct):
        out: dict[str, Any] = {}
        config = value.__struct_config__
        if tag and config.tag is not None:
            out[config.tag_field or "type"] = config.tag
        for name in value.__struct_fields__:
            out[name] = to_builtins(getattr(value, name))
        return out
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode("ascii")}
    if isinstance(value, list | tuple):
        return [to_builtins(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_builtins(v) for k, v in value.items()}
    return value


def decode(
    subject: str, data: bytes, headers: Mapping[str, str] | None = None
) -> tuple[str, dict[str, Any]]:
    """``(type, fields)`` for one message; never raises."""
    if not data and headers and STATUS_HEADER in headers:
        return _status(headers)
    if subject.startswith("$KV."):
        return _kv_entry(subject, data, headers)
    if subject.startswith("$O.") and ".C." in subject:
        return "object_chunk", {"size": len(data), "note": OBJECT_CHUNK_NOTE}
    try:
        message = codec.decode(data, message_union())
    except (codec.DecodeError, msgspec.ValidationError):
        pass
    else:
        return type(message).__name__, to_builtins(message, tag=False)
    return _fallback(data)


def _status(headers: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """A server status message, e.g. "no responders" (503) to a reply subject."""
    fields: dict[str, Any] = {"status": headers.get(STATUS_HEADER)}
    if "Description" in headers:
        fields["description"] = headers["Description"]
    if "Nats-Subject" in headers:
        fields["subject"] = headers["Nats-Subject"]
    kind = "NoResponders" if headers.get(STATUS_HEADER) == "503" else "Status"
    return kind, fields


def _kv_entry(
    subject: str, data: bytes, headers: Mapping[str, str] | None
) -> tuple[str, dict[str, Any]]:
    """``$KV.<bucket>.<key>``: a put (decoded by shape) or a delete/purge marker."""
    _, bucket, key = [*subject.split(".", 2), "", ""][:3]
    operation = (headers or {}).get("KV-Operation")
    if operation in {"DEL", "PURGE"} or not data:
        return "KvDelete", {"bucket": bucket, "key": key, "operation": operation or "DEL"}
    kind, fields = _fallback(data)
    return kind, {"bucket": bucket, "key": key, "value": fields}


def _fallback(data: bytes) -> tuple[str, dict[str, Any]]:
    """Records by shape, then JSON, then base64 with the reason."""
    for record in _RECORDS:
        try:
            return record.__name__, to_builtins(codec.decode(data, record))
        except (codec.DecodeError, msgspec.ValidationError):
            continue
    try:
        parsed = json.loads(data)
    except ValueError:
        pass
    else:
        return "json", parsed if isinstance(parsed, dict) else {"value": parsed}
    return "raw", {"size": len(data), "base64": base64.b64encode(data).decode("ascii")}


# --- lines ---------------------------------------------------------------------------------------


def iso(ts: datetime) -> str:
    """UTC time with microseconds and a ``Z``."""
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def line(
    subject: str,
    data: bytes,
    *,
    time: datetime,
    reply: str = "",
    headers: Mapping[str, str] | None = None,
    seq: int | None = None,
    raw: bool = False,
) -> bytes:
    """One JSON line (newline included): subject, type, time[, seq, reply, headers], fields."""
    if raw:
        kind, fields = (
            "raw",
            {
                "size": len(data),
                "base64": base64.b64encode(data).decode("ascii"),
            },
        )
    else:
        kind, fields = decode(subject, data, headers)
    out: dict[str, Any] = {"subject": subject, "type": kind, "time": iso(time)}
    if seq is not None:
        out["seq"] = seq
    elif reply:  # a replayed message's reply is JetStream's ack subject: noise
        out["reply"] = reply
    if headers:
        out["headers"] = dict(headers)
    out["fields"] = fields
    return LINE_ENCODER.encode(out) + b"\n"


# --- subjects ------------------------------------------------------------------------------------


def expand(subject: str, namespace: str) -> str:
    """``kv.>`` → ``<namespace>.v1.kv.>``; absolute subjects are kept.

    Absolute: starts with ``$`` or ``_INBOX``, is ``>``, starts with ``<namespace>.``, or has
    the version (``v1``) as its second token (another namespace's subject).
    """
    tokens = subject.split(".")
    if (
        subject.startswith(("$", "_INBOX"))
        or subject == ">"
        or tokens[0] == namespace
        or (len(tokens) > 1 and tokens[1] == VERSION)
    ):
        return subject
    return f"{namespace}.{VERSION}.{subject}"


def matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match of a concrete ``subject`` (``*`` one token, ``>`` the rest)."""
    pat, sub = pattern.split("."), subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


def is_subset(narrow: str, wide: str) -> bool:
    """Every subject ``narrow`` matches, ``wide`` matches too."""
    n, w = narrow.split("."), wide.split(".")
    for i, token in enumerate(w):
        if token == ">":
            return len(n) > i
        if i >= len(n) or n[i] == ">" or (token != "*" and (n[i] == "*" or n[i] != token)):
            return False
    return len(n) == len(w)


def overlaps(a: str, b: str) -> bool:
    """Some subject matches both patterns."""
    x, y = a.split("."), b.split(".")
    for i in range(max(len(x), len(y))):
        if i >= len(x) or i >= len(y):
            return False
        p, q = x[i], y[i]
        if p == ">" or q == ">":
            return True
        if p != q and p != "*" and q != "*":
            return False
    return True


def covering(patterns: list[str]) -> str:
    """The narrowest ``<literal tokens>.>`` (or ``>``) that matches every pattern.

    Tap reads several subjects through this one subscription (and filters with ``matches``), so
    its lines keep the server's delivery order; one subscription per subject would not.
    """
    if len(set(patterns)) == 1:
        return patterns[0]
    split = [p.split(".") for p in patterns]
    prefix: list[str] = []
    for tokens in zip(*split, strict=False):
        if len(set(tokens)) != 1 or tokens[0] in {"*", ">"}:
            break
        prefix.append(tokens[0])
    # ``a.>`` does not match ``a`` itself: keep at least one token after the prefix.
    while prefix and any(len(tokens) <= len(prefix) for tokens in split):
        prefix.pop()
    return ".".join([*prefix, ">"])


def stream_filters(pattern: str, stream_subjects: list[str]) -> list[str]:
    """Consumer filter subjects for ``pattern`` on a stream holding ``stream_subjects``.

    ``pattern`` itself when the stream holds all of it; else the stream's subjects that overlap
    it (the caller still filters each message with ``matches``).
    """
    if any(is_subset(pattern, s) for s in stream_subjects):
        return [pattern]
    return [s for s in stream_subjects if overlaps(pattern, s)]


# --- durations -----------------------------------------------------------------------------------

_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h|d)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> timedelta:
    """``90s``, ``5m``, ``1.5h``, ``2d``, ``250ms``; a bare number is seconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h, 2d)")
    return timedelta(seconds=float(match["n"]) * _UNIT_S[match["unit"] or "s"])
