"""A deterministic JSON instance valid against a JSON Schema (pure): what a model constrained by
guided decoding would write for a tool's ``parameters`` or a ``json_schema`` response format.

Covers the schema keywords clients send in practice: ``type`` (one or a list), ``const``,
``enum``, ``properties`` / ``required`` / ``additionalProperties`` / ``minProperties``,
``items`` / ``prefixItems`` / ``minItems`` / ``maxItems`` / ``uniqueItems``, ``anyOf`` /
``oneOf`` (the first branch that is not ``null``), ``allOf`` (merged), local ``$ref``
(``#/$defs/...``, ``#/definitions/...``), numeric bounds (``minimum``, ``maximum``, the
exclusive ones, ``multipleOf``), string lengths and common ``format`` values. ``pattern`` is not
honoured (a simulator has no regex sampler). Optional properties are written down to a depth of
``OPTIONAL_DEPTH`` so that recursive schemas end.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

OPTIONAL_DEPTH = 3
"""Below this nesting depth only required properties and ``minItems`` items are written
(recursive schemas end)."""
MAX_DEPTH = 24
"""A schema nested deeper than this (or a ``$ref`` cycle with required recursion) gets ``null``."""

_WORDS = (
    "river",
    "market",
    "bridge",
    "clock",
    "lamp",
    "ferry",
    "bread",
    "harvest",
    "school",
    "notebook",
    "square",
    "evening",
    "morning",
    "traveller",
    "engineer",
    "baker",
    "garden",
    "window",
    "mill",
    "chapel",
)
_CITIES = ("Paris", "Lisbon", "Tokyo", "Nairobi", "Lima", "Oslo", "Austin", "Hanoi")
_FORMATS = {
    "date-time": "2024-05-17T09:30:00Z",
    "date": "2024-05-17",
    "time": "09:30:00",
    "email": "ferryman@example.com",
    "uri": "https://example.com/river",
    "url": "https://example.com/river",
    "uuid": "3f2b8c1e-6d4a-4f0b-9c2e-7a1d5e8b9f30",
    "hostname": "example.com",
    "ipv4": "192.0.2.7",
    "ipv6": "2001:db8::7",
    "duration": "P3D",
}
_Limit = tuple[float | None, bool]
"""A bound and whether it is exclusive."""
_TYPE_ORDER = ("object", "array", "string", "integer", "number", "boolean", "null")


def instance(schema: Mapping[str, Any] | bool, seed: int | str = 0) -> Any:
    """A JSON value valid against ``schema`` (a whole document: its ``$defs`` resolve ``$ref``),
    the same for the same ``seed``."""
    root = schema if isinstance(schema, Mapping) else {}
    return _Writer(root, random.Random(f"schema:{seed}")).value(schema, 0, "")


class _Writer:
    def __init__(self, root: Mapping[str, Any], rng: random.Random) -> None:
        self._root = root
        self._rng = rng

    def value(self, schema: Mapping[str, Any] | bool, depth: int, name: str) -> Any:
        if not isinstance(schema, Mapping) or depth > MAX_DEPTH:
            return None if depth > MAX_DEPTH else self._word()
        schema = self._resolve(schema, depth)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return enum[self._rng.randrange(len(enum))]
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                merged = {k: v for k, v in schema.items() if k != key}
                return self.value({**merged, **self._branch(branches, depth)}, depth + 1, name)
        kind = _kind(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth, name)
        if kind == "integer":
            return self._integer(schema)
        if kind == "number":
            return self._number(schema)
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(schema, name)

    def _resolve(self, schema: Mapping[str, Any], depth: int) -> Mapping[str, Any]:
        """Follow a local ``$ref`` and merge ``allOf`` into one schema."""
        for _ in range(MAX_DEPTH):
            ref = schema.get("$ref")
            if not isinstance(ref, str):
                break
            target = _pointer(self._root, ref)
            schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
        parts = schema.get("allOf")
        if isinstance(parts, list):
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in parts:
                if isinstance(part, Mapping):
                    _merge(merged, self._resolve(part, depth))
            return merged
        return schema

    def _branch(self, branches: list[Any], depth: int) -> Mapping[str, Any]:
        for branch in branches:
            if isinstance(branch, Mapping):
                resolved = self._resolve(branch, depth)
                if resolved.get("type") != "null":
                    return resolved
        first = branches[0]
        return first if isinstance(first, Mapping) else {}

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required = [r for r in schema.get("required", ()) if isinstance(r, str)]
        names = [*required, *(p for p in props if p not in required)]
        if depth >= OPTIONAL_DEPTH:
            names = required
        result: dict[str, Any] = {}
        for key in names:
            result[key] = self.value(props.get(key, {}), depth + 1, key)
        min_props = schema.get("minProperties")
        extra = schema.get("additionalProperties", True)
        i = 0
        while isinstance(min_props, int) and len(result) < min_props and extra is not False:
            key = f"{self._word()}_{i}"
            i += 1
            if key not in result:
                result[key] = self.value(extra if isinstance(extra, Mapping) else {}, depth + 1, "")
        return result

    def _array(self, schema: Mapping[str, Any], depth: int, name: str) -> list[Any]:
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = schema.get("items", {})
        if isinstance(items, list):  # draft-04 tuple form
            prefix, items = items, schema.get("additionalItems", {})
        low = schema.get("minItems", 0)
        high = schema.get("maxItems")
        count = max(
            low if isinstance(low, int) else 0, len(prefix), 1 if depth < OPTIONAL_DEPTH else 0
        )
        if not isinstance(items, Mapping) and items is False:
            count = len(prefix)
        if isinstance(high, int):
            count = min(count, high)
        unique = schema.get("uniqueItems") is True
        result: list[Any] = []
        for i in range(count):
            item_schema = prefix[i] if i < len(prefix) else items
            value = self.value(item_schema, depth + 1, name)
            for _ in range(8):  # uniqueItems: draw again (seeded) until it differs
                if not unique or value not in result:
                    break
                value = self.value(item_schema, depth + 1, name)
            if unique and value in result:
                break  # the item schema allows too few distinct values
            result.append(value)
        return result

    def _integer(self, schema: Mapping[str, Any]) -> int:
        (low, low_open), (high, high_open) = _limits(schema)
        lo = None if low is None else (math.floor(low) + 1 if low_open else math.ceil(low))
        hi = None if high is None else (math.ceil(high) - 1 if high_open else math.floor(high))
        start = lo if lo is not None else (hi - 10 if hi is not None else 1)
        stop = max(start, hi if hi is not None else start + 99)
        value = self._rng.randint(start, min(stop, start + 99))
        step = schema.get("multipleOf")
        if isinstance(step, int) and not isinstance(step, bool) and step > 0:
            value = -(-value // step) * step
            if hi is not None and value > hi:
                value -= step
        return value

    def _number(self, schema: Mapping[str, Any]) -> float:
        (low, low_open), (high, _) = _limits(schema)
        step = schema.get("multipleOf")
        if isinstance(step, int | float) and not isinstance(step, bool) and step > 0:
            first = math.ceil((low if low is not None else 0.0) / step)
            value = first * step
            if low_open and low is not None and value <= low:
                value += step
            return float(value)
        lo = low if low is not None else (high - 100 if high is not None else 0.0)
        hi = high if high is not None else lo + 100
        if lo == hi:
            return float(lo)
        value = round(lo + (hi - lo) * (0.1 + 0.8 * self._rng.random()), 2)
        if not lo < value < hi:
            value = (lo + hi) / 2
        return float(value)

    def _string(self, schema: Mapping[str, Any], name: str) -> str:
        fmt = schema.get("format")
        text = _FORMATS.get(fmt) if isinstance(fmt, str) else None
        if text is None:
            text = self._named(name)
        low = schema.get("minLength")
        high = schema.get("maxLength")
        while isinstance(low, int) and len(text) < low:
            text += " " + self._word()
        if isinstance(high, int) and len(text) > high:
            text = text[:high].rstrip() or text[:high]
        if isinstance(low, int) and len(text) < low:
            text = text.ljust(low, "x")
        return text

    def _named(self, name: str) -> str:
        lowered = name.lower()
        if any(w in lowered for w in ("city", "location", "place", "town", "destination")):
            return self._rng.choice(_CITIES)
        if "name" in lowered:
            return self._word().capitalize()
        if any(w in lowered for w in ("query", "text", "description", "message", "content")):
            return " ".join(self._word() for _ in range(3))
        return self._word()

    def _word(self) -> str:
        return self._rng.choice(_WORDS)


def _kind(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        named = [k for k in kind if isinstance(k, str)]
        for candidate in _TYPE_ORDER:
            if candidate in named and candidate != "null":
                return candidate
        return "null" if "null" in named else "string"
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema or "minItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    return "string"


def _limits(schema: Mapping[str, Any]) -> tuple[_Limit, _Limit]:
    """``((lowest, exclusive), (highest, exclusive))``; draft-04 boolean exclusives included."""
    low, high = _num(schema.get("minimum")), _num(schema.get("maximum"))
    low_open = schema.get("exclusiveMinimum") is True
    high_open = schema.get("exclusiveMaximum") is True
    ex_low, ex_high = _num(schema.get("exclusiveMinimum")), _num(schema.get("exclusiveMaximum"))
    if ex_low is not None and (low is None or ex_low >= low):
        low, low_open = ex_low, True
    if ex_high is not None and (high is None or ex_high <= high):
        high, high_open = ex_high, True
    return (low, low_open), (high, high_open)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _pointer(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    """A local JSON pointer (``#/$defs/Name``); anything else resolves to ``{}`` (any value)."""
    if not ref.startswith("#"):
        return {}
    node: Any = root
    for part in ref[1:].split("/"):
        if not part:
            continue
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        else:
            return {}
    return node if isinstance(node, Mapping) else {}


def _merge(into: dict[str, Any], part: Mapping[str, Any]) -> None:
    """``allOf``: properties and required united; other keywords the later part's."""
    for key, value in part.items():
        if key == "properties" and isinstance(value, Mapping):
            into["properties"] = {**into.get("properties", {}), **value}
        elif key == "required" and isinstance(value, list):
            into["required"] = [*into.get("required", []), *value]
        else:
            into.setdefault(key, value)
