"""Least-privilege permissions (``shared.bus_permissions``) follow the subject table: each
service may publish what the table says it publishes and subscribe what it subscribes, a worker
only as itself, ``tap`` only reads, and no JetStream stream can be deleted by anyone.
``tests/e2e/test_secure_bus.py`` runs a whole stack under them against a real nats-server."""

from __future__ import annotations

import pytest

from services.cli.tapformat import matches
from shared.bus_catalog import CHANNELS
from shared.bus_permissions import (
    SERVICES,
    WORKERS,
    Permissions,
    catalog_role,
    inbox_prefix,
    permissions,
)
from shared.subjects import Subjects

S = Subjects("ns")


def of(service: str) -> Permissions:
    ids = ("me",) if service in WORKERS else ()
    return permissions(service, S, ids)


def may(patterns: tuple[str, ...], subject: str) -> bool:
    return any(matches(p, subject) for p in patterns)


@pytest.mark.parametrize("service", SERVICES)
def test_every_publisher_and_subscriber_in_the_table_is_allowed(service: str) -> None:
    role, perms = catalog_role(service), of(service)
    for channel in CHANNELS:
        if channel.transport != "core":
            continue
        example = _example(channel.subject)
        if any(p.service == role for p in channel.publishers):
            assert may(perms.publish, example), (service, channel.name, example)
        for sub in channel.subscribers:
            if sub.service == role:
                subject = _example(sub.via) if sub.via is not None else example
                assert may(perms.subscribe, subject), (service, channel.name, subject)


@pytest.mark.parametrize("service", sorted(set(SERVICES) - {"tap"}))
def test_nothing_outside_the_table_is_published(service: str) -> None:
    role, perms = catalog_role(service), of(service)
    for channel in CHANNELS:
        if channel.transport == "core" and all(p.service != role for p in channel.publishers):
            assert not may(perms.publish, _example(channel.subject)), (service, channel.name)


@pytest.mark.parametrize("service", sorted(WORKERS))
def test_a_worker_acts_only_as_itself(service: str) -> None:
    perms = permissions(service, S, ("w1",))
    for subject in (S.kv_events("w2"), S.load("w2"), S.lifecycle("w2"), "$KV.ns_workers.w2"):
        assert not may(perms.publish, subject), subject
    others = (S.generate, S.worker_ping, S.embed_worker, S.tensor_infer, S.media_generate)
    for subject in (ref("w2") for ref in others):
        assert not may(perms.subscribe, subject), subject
    assert may(perms.publish, "$KV.ns_workers.w1")


def test_an_llm_worker_publishes_its_own_kv_events_and_no_one_elses() -> None:
    perms = permissions("mocker", S, ("w1", "w3"))
    assert may(perms.publish, S.kv_events("w1"))
    assert may(perms.publish, S.kv_events("w3"))
    assert not may(perms.publish, S.kv_events("w2"))
    # Only workers write KV events; the router reads them through its consumer.
    assert not may(of("router").publish, S.kv_events("w1"))


def test_tap_reads_everything_and_publishes_no_subject_of_the_namespace() -> None:
    perms = of("tap")
    assert may(perms.subscribe, S.stream("f", "r"))
    assert may(perms.subscribe, S.decisions)
    assert not any(p.startswith(("ns.", "$KV.", "$O.", "_INBOX")) for p in perms.publish)
    assert not any("STREAM.CREATE" in p or "STREAM.UPDATE" in p for p in perms.publish)
    assert perms.allow_responses is False


@pytest.mark.parametrize("service", SERVICES)
def test_no_one_may_delete_or_reach_other_streams_or_inboxes(service: str) -> None:
    perms = of(service)
    assert not any("DELETE" in p and "CONSUMER" not in p for p in perms.publish)
    assert not any(p in ("$JS.API.>", ">", "$JS.>") for p in perms.publish)
    assert not may(perms.publish, "$JS.API.STREAM.INFO.OTHER_STREAM")
    inboxes = [p for p in perms.subscribe if p.startswith("_INBOX")]
    assert inboxes == [f"{inbox_prefix(service)}.>"]


def test_the_embedder_answers_into_the_gateways_inbox_only() -> None:
    perms = of("embedder")
    assert may(perms.publish, f"{inbox_prefix('gateway')}.abc")
    assert not may(perms.publish, f"{inbox_prefix('router')}.abc")


def test_worker_ids_go_with_workers_only() -> None:
    with pytest.raises(ValueError, match="is a worker"):
        permissions("mocker", S)
    with pytest.raises(ValueError, match="only for one"):
        permissions("gateway", S, ("w1",))
    with pytest.raises(ValueError, match="unknown service"):
        permissions("nats-server", S)


def test_as_config_is_the_servers_permissions_block() -> None:
    block = of("formatter").as_config()
    assert set(block) == {"publish", "subscribe", "allow_responses"}
    assert block["publish"]["allow"]
    assert block["subscribe"]["allow"]


def _example(ref: object) -> str:
    """A concrete subject of a table entry: every parameter a sample token."""
    import inspect

    if isinstance(ref, property):
        return str(ref.__get__(S, Subjects))
    names = list(inspect.signature(ref).parameters)[1:]  # type: ignore[arg-type]
    return str(ref(S, *("me" if n == "worker_id" else f"x{n}" for n in names)))  # type: ignore[operator]
