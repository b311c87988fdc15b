"""The bus as an AsyncAPI 3.0 document, from ``shared.bus_catalog`` and ``shared.messages``.

Pure: ``document()`` builds the dict, ``render()`` the JSON text committed as
``docs/asyncapi.json``. Regenerate with ``make asyncapi`` (``python -m shared.asyncapi >
docs/asyncapi.json``); ``tests/unit/test_asyncapi.py`` fails when the committed file drifts.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import sys
import textwrap
from typing import Any

import msgspec

from shared.bus_catalog import (
    CHANNELS,
    PARAMETERS,
    SERVICES,
    Channel,
    Opaque,
    Payload,
    Sub,
    address,
    channel_address,
    inbox,
    member_name,
)
from shared.config import DEFAULT_NATS_URL
from shared.subjects import VERSION

ASYNCAPI_VERSION = "3.0.0"
CONTENT_TYPE = "application/msgpack"
REGENERATE = "make asyncapi (or: python -m shared.asyncapi > docs/asyncapi.json)"
NATS_BINDING_VERSION = "0.1.0"
REQUEST_ID = "The request's id, minted by the gateway; the last token of per-request subjects."
INSTANCE_PARAMETERS = ("worker_id", "formatter_id", "gateway_id", "instance_id")
"""Parameters naming the one instance that subscribes to the subject."""

DESCRIPTION = """\
Every NATS subject JetServe's services talk on: who publishes, who subscribes, how it is \
delivered, what is answered, and every message's shape. Generated from `shared/subjects.py` \
(names), `shared/bus_catalog.py` (who publishes and subscribes) and `shared/messages.py` \
(shapes); regenerate with `make asyncapi`.

**Wire format.** Every body is MessagePack (`application/msgpack`), encoded by `shared.codec` \
from a frozen msgspec Struct. Request-path messages are tagged: the map's `type` key holds the \
class name (`{"type": "Generate", ...}`), so one decoder reads a union; durable records \
(`WorkerCard`, `ModelCard`) are untagged. Payload schemas are the JSON Schema msgspec writes for \
those Structs (as draft-07): a `bytes` field (base64 string in JSON) is MessagePack `bin`, a map \
keyed by integers (`logit_bias`) keeps integer keys, an array-like Struct (`TokenLogprob`) is an \
array.

**Subjects.** `{namespace}.v1.<stage>[.<id>][.<verb>]`; parameters are the `Subjects` member's \
arguments. `jetserve tap 'SUBJECT'` prints each message decoded, one JSON line each \
(`{"subject", "type", "time", "fields"}`); a relative subject such as `kv.>` means \
`<namespace>.v1.kv.>`, and `$KV.<bucket>.>` shows a bucket's records.

**Delivery.** Core NATS (at most once): a subscription with a queue group \
(`bindings.nats.queue`) gets each message on one instance of the group, others on every \
instance. Request/reply answers go to the requester's inbox (reply channels without an \
address). A hop that forwards a request sets its own bounce subject as the NATS reply, to see \
"no responders" (channel `bounce`). KV events are stored in a JetStream stream; worker cards, \
leases, model files and router snapshots in JetStream KV buckets and object stores (`x-jetserve`).
"""


def document(catalog: tuple[Channel, ...] = CHANNELS) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of ``catalog``; raises ValueError naming what is inconsistent
    (an unknown service, two payloads or operations of one name)."""
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    payloads: dict[str, Payload] = {}
    for channel in catalog:
        for payload in _channel_payloads(channel):
            if payloads.setdefault(_name(payload), payload) != payload:
                raise ValueError(f"two payloads named {_name(payload)} (channel {channel.name})")
        for service in [p.service for p in channel.publishers + channel.subscribers]:
            if service not in SERVICES:
                raise ValueError(f"channel {channel.name}: describe {service!r} in SERVICES")
        channels[channel.name] = _channel(channel)
        if channel.reply is not None:
            channels[_reply_name(channel)] = _reply_channel(channel)
        for op_id, op in _operations(channel):
            if op_id in operations:
                raise ValueError(f"operation {op_id} twice: one Pub/Sub per service per channel")
            operations[op_id] = op
    used = sorted({p for c in catalog for p in _params(channel_address(c))})
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "id": "urn:jetserve:bus",
        "info": {
            "title": "JetServe bus",
            "version": VERSION,
            "description": DESCRIPTION,
            "tags": [{"$ref": f"#/components/tags/{s}"} for s in SERVICES],
        },
        "servers": {
            "nats": {
                "host": DEFAULT_NATS_URL.removeprefix("nats://"),
                "protocol": "nats",
                "description": "Default `--nats-url` (`JETSERVE_NATS_URL`, `NATS_URL`); "
                "`jetserve up` starts a private `nats-server -js`.",
            }
        },
        "defaultContentType": CONTENT_TYPE,
        "channels": channels,
        "operations": operations,
        "components": {
            "schemas": _schemas([p for p in payloads.values() if not isinstance(p, Opaque)]),
            "messages": {n: _message(payloads[n]) for n in sorted(payloads)},
            "parameters": {p: _parameter(p) for p in used},
            "tags": {s: {"name": s, "description": d} for s, d in SERVICES.items()},
        },
    }


def render() -> str:
    """``docs/asyncapi.json``'s text."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


# --- channels and operations ---------------------------------------------------------------------


def _channel(channel: Channel) -> dict[str, Any]:
    where = channel_address(channel)
    out: dict[str, Any] = {
        "address": where,
        "title": channel.name,
        "summary": channel.summary,
        "description": _channel_description(channel),
        "messages": {_name(m): _ref("components/messages", _name(m)) for m in channel.messages},
    }
    if params := _params(where):
        out["parameters"] = {p: _ref("components/parameters", p) for p in params}
    out["x-jetserve"] = _extension(channel)
    return out


def _extension(channel: Channel) -> dict[str, Any]:
    """Where the subject comes from in the code, and the JetStream resource behind it."""
    ext: dict[str, Any] = {
        "subject": f"Subjects.{member_name(channel.subject)}",
        "transport": channel.transport,
    }
    wildcards = sorted({f"Subjects.{member_name(s.via)}" for s in channel.subscribers if s.via})
    if wildcards:
        ext["subscribeWith"] = wildcards
    if channel.store is not None:
        ext["store"] = {"name": address(channel.store), "member": member_name(channel.store)}
    return ext


def _channel_description(channel: Channel) -> str:
    pubs = "; ".join(_who(p.service, p.messages, p.note) for p in channel.publishers)
    subs = "; ".join(_sub_text(channel, s) for s in channel.subscribers)
    lines = [f"**Publishers:** {pubs}.", f"**Subscribers:** {subs}."]
    if channel.reply is not None:
        answer = " or ".join(f"`{_name(m)}`" for m in channel.reply.messages)
        lines.append(f"**Request/reply:** answered with {answer} on the requester's inbox.")
        if channel.reply.note:
            lines.append(channel.reply.note)
    if channel.answers_on is not None:
        a = channel.answers_on
        names = ", ".join(f"`{_name(m)}`" for m in a.messages)
        lines.append(
            f"**Answers:** {names} on channel `{a.channel}`, at the subject in `{a.field}`."
        )
    if channel.transport == "jetstream" and channel.store is not None:
        lines.append(f"**JetStream:** stored in stream `{address(channel.store)}`.")
    if channel.transport in ("kv", "object_store"):
        kind = "KV bucket" if channel.transport == "kv" else "object store"
        lines.append(f"**JetStream:** {kind} `{address(channel.subject)}`.")
    if channel.description:
        lines.append(channel.description)
    return "\n\n".join(lines)


def _who(service: str, messages: tuple[Payload, ...], note: str) -> str:
    text = f"`{service}`"
    details = [", ".join(f"`{_name(m)}`" for m in messages)] if messages else []
    details += [note] if note else []
    return f"{text} ({'; '.join(details)})" if details else text


def _sub_text(channel: Channel, sub: Sub) -> str:
    details = [_delivery(channel, sub)]
    if sub.via is not None:
        details.append(f"subscribes to `{address(sub.via)}`")
    if sub.note:
        details.append(sub.note)
    return f"`{sub.service}` ({'; '.join(details)})"


def _delivery(channel: Channel, sub: Sub) -> str:
    """How the messages reach this subscriber: queue group, broadcast, its own subject."""
    if channel.transport == "kv":
        return "reads and watches the bucket"
    if channel.transport == "object_store":
        return "reads objects"
    if channel.transport == "jetstream":
        return "a JetStream consumer of the stream"
    if sub.queue:
        return f"queue group `{sub.queue}`: one instance gets each message"
    own = [p for p in _params(address(channel.subject)) if p in INSTANCE_PARAMETERS]
    if own:
        return f"its own subject: `{{{own[0]}}}` is its id"
    return "broadcast: every instance"


def _operations(channel: Channel) -> list[tuple[str, dict[str, Any]]]:
    ops: list[tuple[str, dict[str, Any]]] = []
    for pub in channel.publishers:
        sent = pub.messages or channel.messages
        op = _operation("send", channel, pub.service, sent, pub.note)
        if channel.answers_on is not None:
            op["reply"] = _answers(channel)
        ops.append((f"{pub.service}_sends_{channel.name}", op))
    for sub in channel.subscribers:
        op = _operation("receive", channel, sub.service, channel.messages, sub.note)
        op["description"] = _sub_text(channel, sub)
        if sub.queue:
            op["bindings"] = {"nats": {"queue": sub.queue, "bindingVersion": NATS_BINDING_VERSION}}
        ops.append((f"{sub.service}_receives_{channel.name}", op))
    return ops


def _operation(
    action: str, channel: Channel, service: str, messages: tuple[Payload, ...], note: str
) -> dict[str, Any]:
    verb = "sends" if action == "send" else "receives"
    names = ", ".join(_name(m) for m in messages)
    op: dict[str, Any] = {
        "action": action,
        "channel": _ref("channels", channel.name),
        "title": f"{service} {verb} {names}",
        "summary": note or channel.summary,
        "tags": [_ref("components/tags", service)],
        "messages": [_ref(f"channels/{channel.name}/messages", _name(m)) for m in messages],
    }
    if channel.reply is not None:
        reply = _reply_name(channel)
        op["reply"] = {
            "channel": _ref("channels", reply),
            "messages": [
                _ref(f"channels/{reply}/messages", _name(m)) for m in channel.reply.messages
            ],
        }
    return op


def _answers(channel: Channel) -> dict[str, Any]:
    """The reply of a request answered on another channel, at the subject a field names."""
    assert channel.answers_on is not None
    a = channel.answers_on
    return {
        "address": {
            "location": f"$message.payload#/{a.field}",
            "description": f"The `{a.channel}` subject in the message's `{a.field}`.",
        },
        "channel": _ref("channels", a.channel),
        "messages": [_ref(f"channels/{a.channel}/messages", _name(m)) for m in a.messages],
    }


def _reply_name(channel: Channel) -> str:
    return inbox(channel.name)


def _reply_channel(channel: Channel) -> dict[str, Any]:
    assert channel.reply is not None
    return {
        "address": None,
        "title": _reply_name(channel),
        "summary": f"Answers to `{channel.name}`, on the requester's NATS inbox (`_INBOX.…`).",
        "messages": {
            _name(m): _ref("components/messages", _name(m)) for m in channel.reply.messages
        },
    }


def _channel_payloads(channel: Channel) -> list[Payload]:
    found = list(channel.messages)
    found += channel.reply.messages if channel.reply else ()
    return found


def _params(where: str) -> list[str]:
    """The ``{name}`` parameters of an address, in order."""
    names = [part.split("}", 1)[0] for part in where.split("{")[1:]]
    return list(dict.fromkeys(names))


def _parameter(name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"description": PARAMETERS[name]}
    if name == "namespace":
        out["default"] = "jetserve"
    return out


def _ref(where: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/{where}/{name}"}


def _name(payload: Payload) -> str:
    return payload.name if isinstance(payload, Opaque) else payload.__name__


# --- messages and schemas ------------------------------------------------------------------------


def _message(payload: Payload) -> dict[str, Any]:
    if isinstance(payload, Opaque):
        out: dict[str, Any] = {
            "name": payload.name,
            "title": payload.name,
            "summary": payload.summary,
            "contentType": payload.content_type,
        }
        if payload.headers:
            out["headers"] = {
                "type": "object",
                "properties": {k: {"const": v} for k, v in payload.headers},
                "required": [k for k, _ in payload.headers],
            }
        return out
    doc = inspect.cleandoc(payload.__doc__ or payload.__name__)
    config = payload.__struct_config__
    wire = (
        f"MessagePack map with `{config.tag_field}` = `{config.tag}`."
        if config.tag is not None
        else "MessagePack map, untagged (a durable record)."
    )
    return {
        "name": payload.__name__,
        "title": payload.__name__,
        "summary": doc.split("\n\n", 1)[0].replace("\n", " "),
        "description": f"{doc}\n\n{wire}",
        "contentType": CONTENT_TYPE,
        "payload": _ref("components/schemas", payload.__name__),
    }


def _schemas(structs: list[Any]) -> dict[str, Any]:
    """JSON Schema of every Struct (and what they contain), as draft-07, field docs added."""
    _, found = msgspec.json.schema_components(structs, ref_template="#/components/schemas/{name}")
    components = msgspec.json.decode(msgspec.json.encode(found))  # defaults: () -> [], bytes
    out: dict[str, Any] = {}
    for name in sorted(components):
        schema = _draft07(components[name])
        if "description" in schema:
            schema["description"] = inspect.cleandoc(schema["description"])
        out[name] = schema
    for cls in _all_structs(structs):
        if cls.__name__ in out:
            _describe_fields(out[cls.__name__], cls)
    return out


def _draft07(schema: Any) -> Any:
    """msgspec writes draft 2020-12 (``prefixItems``, OpenAPI's ``discriminator`` object);
    AsyncAPI schemas are draft-07: ``items`` as a list, ``discriminator`` as the field name."""
    if isinstance(schema, list):
        return [_draft07(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _draft07(v) for k, v in schema.items()}
    if "prefixItems" in out:
        rest = out.pop("items", None)
        out["items"] = out.pop("prefixItems")
        if rest is not None:
            out["additionalItems"] = rest
    if isinstance(out.get("discriminator"), dict):
        out["discriminator"] = out["discriminator"]["propertyName"]
    return out


def _all_structs(roots: list[Any]) -> list[type[msgspec.Struct]]:
    """Every Struct class reachable from ``roots`` through field types (and their bases)."""
    seen: dict[str, type[msgspec.Struct]] = {}
    todo = list(roots)
    while todo:
        cls = todo.pop()
        if not (inspect.isclass(cls) and issubclass(cls, msgspec.Struct)):
            continue
        if cls.__name__ in seen:
            continue
        seen[cls.__name__] = cls
        for field in msgspec.structs.fields(cls):
            todo.extend(_classes_in(field.type))
    return list(seen.values())


def _classes_in(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", ())
    return [annotation, *(c for a in args for c in _classes_in(a))]


def _describe_fields(schema: dict[str, Any], cls: type[msgspec.Struct]) -> None:
    """Attribute docstrings (the string under a field) become the properties' descriptions."""
    properties = schema.get("properties", {})
    if "request_id" in properties:
        properties["request_id"]["description"] = REQUEST_ID
    for base in reversed(cls.__mro__):
        for field, doc in _field_docs(base).items():
            prop = properties.get(field)
            if prop is None:
                continue
            if "$ref" in prop:  # draft-07 ignores a $ref's siblings
                properties[field] = prop = {"allOf": [prop]}
            prop["description"] = doc


def _field_docs(cls: type) -> dict[str, str]:
    if cls.__module__ in ("builtins", "msgspec"):
        return {}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


if __name__ == "__main__":
    sys.stdout.write(render())
