"""Parameter types from the request's tool schemas, and raw parameter text typed by them (for
syntaxes that write values as raw text, such as Qwen3-Coder's XML). Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

Types = frozenset[str]
"""JSON-schema type names a parameter accepts; empty when the schema does not say."""


def parameter_types(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Types]]:
    """Function name → parameter name → accepted types, from OpenAI-style tools
    (``{"type": "function", "function": {"name", "parameters"}}``) or flat ones (``name`` with
    ``parameters`` or Anthropic's ``input_schema``)."""
    table: dict[str, dict[str, Types]] = {}
    for tool in tools:
        fn = tool.get("function", tool)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        schema = fn.get("parameters") or fn.get("input_schema") or {}
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        if isinstance(props, Mapping):
            table[fn["name"]] = {str(k): schema_types(v) for k, v in props.items()}
    return table


def schema_types(schema: object) -> Types:
    """The types one property schema accepts (``type``, ``anyOf``/``oneOf``, or guessed from
    ``properties`` / ``items`` / ``enum``)."""
    if not isinstance(schema, Mapping):
        return frozenset()
    declared = schema.get("type")
    types: set[str] = set()
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            types |= schema_types(sub)
    if not types:
        if "properties" in schema:
            types.add("object")
        elif "items" in schema:
            types.add("array")
        elif isinstance(schema.get("enum"), list):
            types.update(json_type(v) for v in schema["enum"])
    return frozenset(types)


def is_text(types: Types) -> bool:
    """Whether a value of these types is kept as the raw text (a string, or nothing known)."""
    return types <= {"string"}


def json_type(value: object) -> str:
    """The JSON-schema type name of a decoded JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def typed_value(raw: str, types: Types) -> object:
    """Raw parameter text as the schema wants it: strings stay strings; other types are parsed
    as JSON, falling back to the text (when the text does not parse, or it parses to a type the
    schema does not allow while it allows a string)."""
    if is_text(types):
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        word = raw.strip().lower()
        if "boolean" in types and word in ("true", "false"):
            return word == "true"  # Python spelling: True / False
        return raw
    kind = json_type(value)
    allowed = kind in types or (kind == "integer" and "number" in types)
    if "string" in types and not allowed:
        return raw
    return value
