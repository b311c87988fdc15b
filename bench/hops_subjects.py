"""Bus subjects as templates for ``bench.hops``: ids (workers, requests, inboxes, consumers)
replaced by placeholders, answers named after their requests, and each template's class
(request path, side effect of a request, periodic). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

PATH = "path"
"""A message that carries the request from hop to hop (or answers one that does)."""
SIDE_EFFECT = "side_effect"
"""Caused by the request but off its path: routing decisions, lifecycle, load, KV events."""
PERIODIC = "periodic"
"""Not caused by the request: heartbeats, watch checks, advisories; charged per request by time."""

PATH_SUBJECTS = frozenset(
    {
        "preprocess",
        "formatter.open",
        "formatter.open [reply]",
        "formatter.<formatter>.open",
        "router.generate",
        "router.status",
        "router.status [reply]",
        "worker.<worker>.generate",
        "router.<id>.prefilled",
        "stream.<formatter>.<request>",
        "gateway.<gateway>.<request>",
        "bounce.<instance>.<request>",
        "cancel",
    }
)
"""Templates (after ``<namespace>.v1.``) of the request path: gateway → … → gateway."""
SIDE_EFFECT_SUBJECTS = frozenset(
    {
        "decisions",
        "lifecycle.<worker>",
        "load.<worker>",
        "kv.<worker>",
        "kv.<worker> [reply]",
        "kv.<worker> [delivery]",
        "worker.<worker>.kv_release",
    }
)

_PER_WORKER = frozenset({"worker", "kv", "load", "lifecycle"})
_TWO_IDS = {
    "stream": ("<formatter>", "<request>"),
    "gateway": ("<gateway>", "<request>"),
    "bounce": ("<instance>", "<request>"),
}
_ID = re.compile(r"^(?:[A-Za-z_]+-)?[0-9a-f]{6,}(?:-[A-Za-z0-9]+)?$|^[0-9]+$")


def is_id(token: str) -> bool:
    """Whether a subject token is an id (request, worker, inbox, consumer), not a word."""
    if _ID.match(token):
        return True
    return len(token) >= 16 and any(c.isdigit() for c in token)


def _generic(tokens: Sequence[str]) -> str:
    return ".".join("<id>" if is_id(t) else t for t in tokens)


def _dollar(tokens: list[str]) -> str:
    """``$JS``, ``$KV`` and ``$O`` subjects: stream, bucket and store names stay, ids go."""
    head = tokens[:3]
    if tokens[:2] == ["$JS", "ACK"] and len(tokens) >= 4:
        return f"$JS.ACK.{tokens[2]}.<consumer>"
    if tokens[:2] == ["$JS", "FC"] and len(tokens) >= 4:
        return f"$JS.FC.{tokens[2]}.<consumer>"
    if head == ["$JS", "API", "CONSUMER"] and len(tokens) >= 5:
        stream_at = 5 if tokens[3] in ("MSG", "DURABLE") else 4
        out = tokens[: stream_at + 1]
        if len(tokens) > stream_at + 1:
            out.append("<consumer>")
        if len(tokens) > stream_at + 2:
            out.append("<filter>")
        return ".".join(out)
    if tokens[:3] == ["$JS", "API", "DIRECT"] and len(tokens) > 5:
        return ".".join([*tokens[:5], "<subject>"])
    if tokens[0] == "$KV" and len(tokens) >= 3:
        return f"$KV.{tokens[1]}.<key>"
    if tokens[0] == "$O" and len(tokens) >= 4:
        return f"$O.{tokens[1]}.{tokens[2]}.<id>"
    return _generic(tokens)


def _namespaced(rest: list[str]) -> str:
    """``<namespace>.v1.`` subjects, ids replaced by what they name (shared/subjects.py)."""
    stage = rest[0]
    if stage in _PER_WORKER and len(rest) >= 2:
        rest[1] = "<worker>"
    elif stage in _TWO_IDS and len(rest) == 3:
        rest[1:] = _TWO_IDS[stage]
    elif stage == "formatter" and len(rest) == 3:
        rest[1] = "<formatter>"
    return _generic(rest)


def template(subject: str, namespace: str) -> str:
    """The subject with its ids replaced by placeholders, e.g.
    ``ns.v1.worker.mocker-d62.generate`` → ``ns.v1.worker.<worker>.generate``."""
    tokens = subject.split(".")
    if tokens[0].startswith("$"):
        return _dollar(tokens)
    if tokens[0] == "_INBOX":
        named = len(tokens) >= 3 and not is_id(tokens[1])
        return f"_INBOX.{tokens[1]}.<inbox>" if named else "_INBOX.<inbox>"
    prefix = f"{namespace}.v1."
    if subject.startswith(prefix) and len(tokens) > 2:
        return prefix + _namespaced(tokens[2:])
    return _generic(tokens)


def templates(messages: Iterable[tuple[str, str]], namespace: str) -> list[str]:
    """The template of each (subject, reply), in order. An answer on an ``_INBOX`` subject is
    named after the request it answers (``<template> [reply]``); a JetStream delivery (its
    reply is a ``$JS.ACK`` subject) gets `` [delivery]``."""
    asked: dict[str, str] = {}
    out: list[str] = []
    for subject, reply in messages:
        if subject.startswith("_INBOX.") and subject in asked:
            name = f"{asked[subject]} [reply]"
        else:
            name = template(subject, namespace)
            if reply.startswith("$JS.ACK."):
                name += " [delivery]"
        if reply.startswith("_INBOX."):
            asked[reply] = name
        out.append(name)
    return out


def relative(name: str, namespace: str) -> str:
    """A template without its ``<namespace>.v1.`` prefix."""
    return name.removeprefix(f"{namespace}.v1.")


def category(name: str, namespace: str) -> str:
    """``path``, ``side_effect`` or ``periodic`` for a template."""
    rel = relative(name, namespace)
    if rel in PATH_SUBJECTS:
        return PATH
    if rel in SIDE_EFFECT_SUBJECTS or rel.startswith(f"$JS.ACK.{namespace.upper()}_KV_EVENTS."):
        return SIDE_EFFECT
    return PERIODIC
