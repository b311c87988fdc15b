"""Least privilege on the bus: what each service may publish and subscribe, derived from the
subject table (``shared.bus_catalog``), as nats-server user permissions.

A service gets exactly the subjects of the channels the table lists it on: publish where it is a
``Pub``, subscribe where it is a ``Sub`` (its ``via`` wildcard when it has one), answers to
request/reply channels it serves (``allow_responses``), and its own reply inbox
(``_INBOX.<service>.>``, see :func:`inbox_prefix`), so it cannot read another service's answers.
JetStream-backed channels (the KV-events stream, KV buckets, object stores) add the JetStream API
verbs a reader or a writer of that one stream needs, never another stream's, never ``DELETE``.

A worker is bound to its own ids: it may publish only its own KV events, load and lifecycle
subjects and its own worker card, and receive only requests addressed to it (a worker cannot
publish another worker's KV events). ``tap`` is read-only: every subject of the namespace, the
streams' read verbs, nothing else.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from shared.bus_catalog import CHANNELS, Channel, SubjectRef
from shared.bus_catalog import inbox as inbox_channel
from shared.subjects import VERSION, Subjects

INBOX = "_INBOX"
INBOX_SUFFIX = inbox_channel("")
LLM_WORKERS = frozenset({"mocker", "vllm_worker", "hf_worker"})
"""LLM worker services: the table calls them all ``mocker`` (they speak one contract)."""
WORKERS = LLM_WORKERS | {"echo_tensor", "embedder", "media"}
"""Services that are workers: each instance's permissions name its own worker ids."""
SERVICES = ("gateway", "preprocessor", "router", "formatter", *sorted(WORKERS), "tap")
"""Every service a deployment can give a NATS user."""
OWN = "worker_id"
"""The subject parameter a worker is bound to (its own ids; ``*`` for every other service)."""

_READ_VERBS = (
    "$JS.API.STREAM.INFO.{s}",
    "$JS.API.STREAM.MSG.GET.{s}",
    "$JS.API.DIRECT.GET.{s}",
    "$JS.API.DIRECT.GET.{s}.>",
    "$JS.API.CONSUMER.CREATE.{s}",
    "$JS.API.CONSUMER.CREATE.{s}.>",
    "$JS.API.CONSUMER.INFO.{s}.*",
    "$JS.API.CONSUMER.DELETE.{s}.*",
    "$JS.FC.{s}.>",
    "$JS.API.STREAM.NAMES",
)
"""What reading one stream takes: its info, a message by sequence or subject, an ordered
consumer (created, asked about, deleted; its flow control answered), and finding the stream of
a subject (nats-py asks for the stream names that hold it: names only, no content)."""
_OPEN_VERBS = ("$JS.API.STREAM.CREATE.{s}", "$JS.API.STREAM.UPDATE.{s}")
"""Services create the buckets and streams they use when they come first, and raise their
replicas (``shared.registry.jetstream``); ``tap`` does neither."""
_STORE_WRITE_VERBS = ("$JS.API.STREAM.PURGE.{s}",)
"""An object store's writer purges the chunks of the object it replaces."""


def inbox_prefix(service: str) -> str:
    """The reply inbox prefix of a service's connection: its answers come under it alone."""
    return f"{INBOX}.{service}"


def catalog_role(service: str) -> str:
    """The service's name in the subject table (every LLM worker is ``mocker`` there)."""
    return "mocker" if service in LLM_WORKERS else service


@dataclass(frozen=True, slots=True)
class Permissions:
    """One NATS user's permissions (nats-server's ``permissions`` block)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool

    def as_config(self) -> dict[str, Any]:
        block: dict[str, Any] = {
            "publish": {"allow": list(self.publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            block["allow_responses"] = True
        return block


def permissions(service: str, subjects: Subjects, worker_ids: Sequence[str] = ()) -> Permissions:
    """The least a ``service`` instance needs on ``subjects``' namespace; a worker's own ids
    are ``worker_ids`` (required for a worker, refused for any other service)."""
    if service not in SERVICES:
        raise ValueError(f"unknown service {service!r}: one of {', '.join(SERVICES)}")
    if (service in WORKERS) != bool(worker_ids):
        raise ValueError(
            f"{service}: worker ids are given for a worker, and only for one"
            if worker_ids
            else f"{service} is a worker: name its worker ids"
        )
    if service == "tap":
        return _tap(subjects)
    role = catalog_role(service)
    bind = tuple(worker_ids) or ("*",)
    publish: list[str] = []
    subscribe = [f"{inbox_prefix(service)}.>"]
    responds = False
    for channel in CHANNELS:
        pubs = any(p.service == role for p in channel.publishers)
        subs = [s for s in channel.subscribers if s.service == role]
        if not pubs and not subs:
            continue
        if channel.transport == "core":
            if pubs:
                publish += _patterns(channel.subject, subjects, bind)
            for sub in subs:
                subscribe += _patterns(sub.via or channel.subject, subjects, bind)
            if subs:
                responds = responds or channel.reply is not None
                publish += _requesters_inboxes(channel)
            continue
        stream = _stream(channel, subjects)
        publish += _verbs(_READ_VERBS + _OPEN_VERBS, stream)
        if pubs:
            publish += _data_subjects(channel, subjects, bind)
            if channel.transport == "object_store":
                publish += _verbs(_STORE_WRITE_VERBS, stream)
    return Permissions(_unique(publish), _unique(subscribe), responds)


def _requesters_inboxes(channel: Channel) -> list[str]:
    """A channel whose answers go to a request's inbox (``AnswersOn`` an ``<x>_inbox``): its
    subscribers answer there, into the inboxes of whoever publishes ``<x>`` (the embedder's
    ``EmbedResult`` goes to the gateway that asked)."""
    if channel.answers_on is None or not channel.answers_on.channel.endswith(INBOX_SUFFIX):
        return []
    asked = channel.answers_on.channel.removesuffix(INBOX_SUFFIX)
    origin = next(c for c in CHANNELS if c.name == asked)
    return [f"{inbox_prefix(p.service)}.>" for p in origin.publishers]


def _tap(subjects: Subjects) -> Permissions:
    """Every subject of the namespace, read-only; JetStream read verbs on every stream."""
    publish: list[str] = []
    for channel in CHANNELS:
        if channel.transport != "core":
            publish += _verbs(_READ_VERBS, _stream(channel, subjects))
    subscribe = [f"{subjects.namespace}.{VERSION}.>", f"{inbox_prefix('tap')}.>"]
    return Permissions(_unique(publish), tuple(subscribe), False)


def _patterns(ref: SubjectRef, subjects: Subjects, bind: Sequence[str]) -> list[str]:
    """The subjects ``ref`` builds: ``worker_id`` as each of ``bind``, other parameters ``*``."""
    if isinstance(ref, property):
        return [str(ref.__get__(subjects, Subjects))]
    names = list(inspect.signature(ref).parameters)[1:]
    if OWN not in names:
        return [ref(subjects, *("*" for _ in names))]
    return [ref(subjects, *(own if n == OWN else "*" for n in names)) for own in bind]


def _stream(channel: Channel, subjects: Subjects) -> str:
    """The JetStream stream behind a stored channel (a bucket's ``KV_``, a store's ``OBJ_``)."""
    if channel.transport == "kv":
        return f"KV_{_patterns(channel.subject, subjects, ())[0]}"
    if channel.transport == "object_store":
        return f"OBJ_{_patterns(channel.subject, subjects, ())[0]}"
    if channel.store is None:
        raise ValueError(f"channel {channel.name}: a JetStream channel names its stream")
    return _patterns(channel.store, subjects, ())[0]


def _data_subjects(channel: Channel, subjects: Subjects, bind: Sequence[str]) -> list[str]:
    """What a writer publishes into a stored channel: the stream's subject (its own worker's),
    a KV bucket's key (a worker card: its own), an object store's chunks and metadata."""
    if channel.transport == "jetstream":
        return _patterns(channel.subject, subjects, bind)
    bucket = _patterns(channel.subject, subjects, ())[0]
    if channel.transport == "object_store":
        return [f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"]
    keys = bind if channel.key == OWN else ("*",)
    return [f"$KV.{bucket}.{key}" for key in keys]


def _verbs(templates: Iterable[str], stream: str) -> list[str]:
    return [t.format(s=stream) for t in templates]


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
