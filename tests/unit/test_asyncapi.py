"""docs/asyncapi.json is the bus as built: generated from the catalog, complete, AsyncAPI 3.0."""

from __future__ import annotations

import difflib
import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import msgspec
import pytest

from shared import bus_catalog, messages
from shared.asyncapi import REGENERATE, document, render
from shared.bus_catalog import CHANNELS, EMBEDDED, Opaque, address, member_name
from shared.subjects import Subjects

DOC = Path(__file__).parents[2] / "docs" / "asyncapi.json"
KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")
"""AsyncAPI's pattern for channel, operation and component keys."""


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return document()


# --- drift --------------------------------------------------------------------------------------


def test_committed_document_is_what_the_generator_writes() -> None:
    committed = DOC.read_text(encoding="utf-8") if DOC.is_file() else ""
    fresh = render()
    if committed != fresh:
        diff = difflib.unified_diff(
            committed.splitlines(),
            fresh.splitlines(),
            "docs/asyncapi.json",
            "generated",
            n=1,
            lineterm="",
        )
        head = "\n".join(list(diff)[:40])
        pytest.fail(f"docs/asyncapi.json is stale; regenerate it: {REGENERATE}\n{head}")


def test_document_is_deterministic() -> None:
    assert render() == render()


# --- completeness -------------------------------------------------------------------------------


def _subject_members() -> set[str]:
    """Public ``Subjects`` members (properties and methods) that return a subject or name."""
    found = set()
    for name, member in vars(Subjects).items():
        fn = member.fget if isinstance(member, property) else member
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        if inspect.signature(fn).return_annotation in ("str", str):
            found.add(name)
    return found


def test_every_subject_of_subjects_py_is_in_the_catalog() -> None:
    missing = sorted(_subject_members() - bus_catalog.referenced_members(CHANNELS))
    assert not missing, (
        f"Subjects members build subjects that shared/bus_catalog.py does not document: "
        f"{', '.join(f'Subjects.{m}' for m in missing)}. Add a Channel(subject=Subjects.<member>, "
        "...) to CHANNELS saying who publishes and who subscribes (a wildcard goes in a Sub's "
        f"`via`, a JetStream stream name in a Channel's `store`); then run {REGENERATE}."
    )


def test_the_catalog_names_only_members_of_subjects() -> None:
    assert bus_catalog.referenced_members(CHANNELS) <= _subject_members()


def _tagged_messages() -> set[type[msgspec.Struct]]:
    """Every concrete tagged Struct of ``shared.messages`` (bases such as ``Message`` left out),
    found as ``jetserve tap`` finds them."""
    tagged = [
        cls
        for _, cls in inspect.getmembers(messages, inspect.isclass)
        if issubclass(cls, msgspec.Struct)
        and cls.__module__ == messages.__name__
        and cls.__struct_config__.tag is not None
    ]
    return {c for c in tagged if not any(o is not c and issubclass(o, c) for o in tagged)}


def _carried() -> set[Any]:
    found: set[Any] = set()
    for c in CHANNELS:
        found.update(c.messages)
        found.update(c.reply.messages if c.reply else ())
    return found


def test_every_tagged_message_travels_on_some_channel() -> None:
    missing = sorted(c.__name__ for c in _tagged_messages() - _carried() - set(EMBEDDED))
    assert not missing, (
        f"shared.messages has tagged messages no channel of shared/bus_catalog.py carries: "
        f"{', '.join(missing)}. Add each to the `messages` (or `reply=Reply(...)`) of the "
        "Channel it travels on, with the services that publish and subscribe it (or to EMBEDDED "
        f"if it only travels inside another message); then run {REGENERATE}."
    )


def test_embedded_messages_are_part_of_a_carried_message(doc: dict[str, Any]) -> None:
    """EMBEDDED is no place to hide a message: each is in some carried message's schema."""
    schemas = doc["components"]["schemas"]
    assert [c.__name__ for c in EMBEDDED if c.__name__ not in schemas] == []


def test_every_message_of_the_catalog_has_a_message_and_schema(doc: dict[str, Any]) -> None:
    components = doc["components"]
    for payload in _carried():
        if isinstance(payload, Opaque):
            assert payload.name in components["messages"]
        else:
            assert components["messages"][payload.__name__]["contentType"] == "application/msgpack"
            assert payload.__name__ in components["schemas"]


# --- the catalog is consistent -----------------------------------------------------------------


def _matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match, a ``{param}`` token standing for any one token."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i] and not s[i].startswith("{")):
            return False
    return len(p) == len(s)


@pytest.mark.parametrize("channel", CHANNELS, ids=lambda c: c.name)
def test_a_subscribers_wildcard_covers_the_channel_subject(channel: bus_catalog.Channel) -> None:
    for sub in channel.subscribers:
        if sub.via is not None:
            assert _matches(address(sub.via), address(channel.subject)), sub


@pytest.mark.parametrize("channel", CHANNELS, ids=lambda c: c.name)
def test_publishers_send_only_messages_of_their_channel(channel: bus_catalog.Channel) -> None:
    for pub in channel.publishers:
        assert set(pub.messages) <= set(channel.messages), pub
    if channel.answers_on is not None:
        targets = {c.name: set(c.messages) for c in CHANNELS}
        targets |= {bus_catalog.inbox(c.name): set(c.reply.messages) for c in CHANNELS if c.reply}
        assert set(channel.answers_on.messages) <= targets[channel.answers_on.channel]


def test_addresses_are_what_subjects_builds() -> None:
    """The ``{param}`` pattern, filled in, is the subject the member builds."""
    values = {name: f"x{i}" for i, name in enumerate(bus_catalog.PARAMETERS)}
    subjects = Subjects("ns")
    for name in sorted(bus_catalog.referenced_members(CHANNELS)):
        member = vars(Subjects)[name]
        if isinstance(member, property):
            built = member.__get__(subjects, Subjects)
        else:
            args = [values[p] for p in list(inspect.signature(member).parameters)[1:]]
            built = member(subjects, *args)
        pattern = address(member).replace("{NAMESPACE}", "NS")
        assert pattern.format(**{**values, "namespace": "ns"}) == built, name


def test_a_parameter_without_a_description_is_refused() -> None:
    def shard(self: Subjects, shard_id: str) -> str:
        return f"{self.namespace}.v1.shard.{shard_id}"

    with pytest.raises(ValueError, match=r"shard_id.*PARAMETERS"):
        address(shard)


def test_a_service_without_a_description_is_refused() -> None:
    stray = bus_catalog.Channel(
        name="stray",
        subject=Subjects.cancel,
        summary="",
        messages=(messages.Cancel,),
        publishers=(bus_catalog.Pub("janitor"),),
        subscribers=(),
    )
    with pytest.raises(ValueError, match=r"stray.*janitor.*SERVICES"):
        document((stray,))


def test_member_names_follow_renames() -> None:
    assert member_name(Subjects.generate) == "generate"
    assert member_name(Subjects.preprocess) == "preprocess"


# --- AsyncAPI 3.0, structurally ----------------------------------------------------------------


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"{ref}: only local references (no network)"
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict), f"{ref} does not resolve"
        assert part in node, f"{ref} does not resolve"
        node = node[part]
    return node


def test_required_top_level_fields(doc: dict[str, Any]) -> None:
    assert doc["asyncapi"] == "3.0.0"
    assert doc["info"]["title"]
    assert doc["info"]["version"]
    assert doc["defaultContentType"] == "application/msgpack"
    assert "MessagePack" in doc["info"]["description"]
    assert doc["channels"]
    assert doc["operations"]
    assert set(doc) <= {
        "asyncapi", "id", "info", "servers", "defaultContentType", "channels", "operations",
        "components",
    }  # fmt: skip


def test_every_ref_resolves(doc: dict[str, Any]) -> None:
    refs = set(_refs(doc))
    assert len(refs) > 50
    for ref in sorted(refs):
        _resolve(doc, ref)


def test_the_document_survives_a_json_round_trip(doc: dict[str, Any]) -> None:
    assert json.loads(render()) == doc


def test_keys_are_valid_asyncapi_keys(doc: dict[str, Any]) -> None:
    keys = [*doc["channels"], *doc["operations"]]
    keys += [k for section in doc["components"].values() for k in section]
    assert [k for k in keys if not KEY.match(k)] == []


def test_channel_parameters_are_those_of_its_address(doc: dict[str, Any]) -> None:
    for name, channel in doc["channels"].items():
        where = channel["address"]
        if where is None:  # a requester's inbox
            assert name.endswith("_inbox")
            continue
        named = set(re.findall(r"\{([^}]+)\}", where))
        assert set(channel.get("parameters", {})) == named, name
        assert channel["messages"], name


def test_operations_point_at_their_channels_messages(doc: dict[str, Any]) -> None:
    for op_id, op in doc["operations"].items():
        assert op["action"] in ("send", "receive"), op_id
        channel = op["channel"]["$ref"]
        assert channel.startswith("#/channels/"), op_id
        for message in op["messages"]:
            assert message["$ref"].startswith(f"{channel}/messages/"), op_id
        if "reply" in op:
            target = op["reply"]["channel"]["$ref"]
            for message in op["reply"]["messages"]:
                assert message["$ref"].startswith(f"{target}/messages/"), op_id


def test_every_channel_has_a_sender_and_a_receiver(doc: dict[str, Any]) -> None:
    actions: dict[str, set[str]] = {}
    for op in doc["operations"].values():
        actions.setdefault(op["channel"]["$ref"], set()).add(op["action"])
    for name, channel in doc["channels"].items():
        if channel["address"] is not None:
            assert actions.get(f"#/channels/{name}") == {"send", "receive"}, name


def test_queue_groups_are_nats_bindings(doc: dict[str, Any]) -> None:
    op = doc["operations"]["preprocessor_receives_preprocess"]
    assert op["bindings"]["nats"]["queue"] == "preprocessor"


def test_payload_schemas_are_valid_draft_07(doc: dict[str, Any]) -> None:
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft7Validator.check_schema(schema)
        text = json.dumps(schema)
        assert "prefixItems" not in text, name  # 2020-12 only: AsyncAPI schemas are draft-07
        assert '"discriminator": {' not in text, name  # a field name in AsyncAPI


def test_a_message_validates_against_its_schema(doc: dict[str, Any]) -> None:
    """The schemas describe what is on the wire: a real message, as builtins, conforms."""
    batch = messages.TokenBatch(
        request_id="r1",
        token_ids=(1, 2),
        logprobs=(messages.TokenLogprob(-0.5, ((1, -0.5),)), messages.TokenLogprob(-1.0)),
    )
    resolver_doc = {"components": doc["components"]}
    schema = {**doc["components"]["schemas"]["TokenBatch"], **resolver_doc}
    as_json = msgspec.json.decode(msgspec.json.encode(batch))
    jsonschema.validate(as_json, schema, cls=jsonschema.Draft7Validator)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"type": "TokenBatch"}, schema, cls=jsonschema.Draft7Validator)
