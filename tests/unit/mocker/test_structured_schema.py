"""Schema instances: valid (checked by ``jsonschema``) for the keywords clients send, and
deterministic in their seed."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from services.mocker.schema_instance import instance

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
PYDANTIC = {  # what openai's client.beta.chat.completions.parse sends for nested models
    "$defs": {
        "Step": {
            "properties": {
                "explanation": {"title": "Explanation", "type": "string"},
                "output": {"title": "Output", "type": "string"},
            },
            "required": ["explanation", "output"],
            "title": "Step",
            "type": "object",
            "additionalProperties": False,
        }
    },
    "properties": {
        "steps": {"items": {"$ref": "#/$defs/Step"}, "title": "Steps", "type": "array"},
        "final_answer": {"title": "Final Answer", "type": "string"},
    },
    "required": ["steps", "final_answer"],
    "title": "MathReasoning",
    "type": "object",
    "additionalProperties": False,
}
TREE = {  # recursive: optional children of the same type must end
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
            },
            "required": ["name"],
        }
    },
    "$ref": "#/$defs/Node",
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "weather": WEATHER,
    "pydantic_refs": PYDANTIC,
    "recursive": TREE,
    "const_and_nullable": {
        "type": "object",
        "properties": {
            "kind": {"const": "event"},
            "note": {"type": ["string", "null"]},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 10}]},
        },
        "required": ["kind", "note", "maybe"],
    },
    "one_of": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"b": {"type": "integer"}},
                "required": ["b"],
                "additionalProperties": False,
            },
        ]
    },
    "all_of": {
        "allOf": [
            {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
            {"properties": {"y": {"type": "boolean"}}, "required": ["y"]},
        ]
    },
    "numbers": {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "count": {"type": "integer", "exclusiveMinimum": 4, "maximum": 5},
            "even": {"type": "integer", "multipleOf": 2, "minimum": 3, "maximum": 9},
            "price": {"type": "number", "multipleOf": 0.25, "minimum": 1},
            "negative": {"type": "number", "maximum": -3.5},
        },
        "required": ["ratio", "count", "even", "price", "negative"],
    },
    "strings": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "minLength": 12, "maxLength": 14},
            "short": {"type": "string", "maxLength": 2},
            "when": {"type": "string", "format": "date-time"},
            "email": {"type": "string", "format": "email"},
        },
        "required": ["code", "short", "when", "email"],
    },
    "arrays": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "enum": ["a", "b", "c"]},
                "minItems": 2,
                "maxItems": 3,
                "uniqueItems": True,
            },
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "minItems": 2,
            },
            "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        },
        "required": ["tags", "pair", "matrix"],
    },
    "min_properties": {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "minProperties": 2,
    },
    "top_level_array": {"type": "array", "items": {"type": "boolean"}, "minItems": 3},
    "draft4_exclusive": {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "integer",
        "minimum": 5,
        "exclusiveMinimum": True,
        "maximum": 6,
    },
    "untyped": {"properties": {"q": {}}, "required": ["q"]},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_instance_is_valid(name: str, seed: int) -> None:
    schema = SCHEMAS[name]
    jsonschema.validate(instance(schema, seed), schema)


def test_required_properties_are_always_written() -> None:
    for seed in range(20):
        value = instance(PYDANTIC, seed)
        assert set(value) == {"steps", "final_answer"}
        assert value["steps"]
        assert set(value["steps"][0]) == {"explanation", "output"}


def test_the_same_seed_gives_the_same_instance_and_seeds_vary() -> None:
    assert instance(WEATHER, 3) == instance(WEATHER, 3)
    assert len({str(instance(WEATHER, s)) for s in range(20)}) > 1


def test_enum_values_come_from_the_enum() -> None:
    units = {instance(WEATHER, s)["unit"] for s in range(30)}
    assert units == {"celsius", "fahrenheit"}


STRICT_TREE = {  # TREE as pydantic writes it in OpenAI's strict mode: every property required
    "$defs": {
        "Node": {
            **TREE["$defs"]["Node"],
            "required": ["name", "children"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/Node",
}


@pytest.mark.parametrize("schema", [TREE, STRICT_TREE], ids=["optional", "required"])
def test_recursive_schema_ends(schema: dict[str, Any]) -> None:
    value = instance(schema, 1)
    jsonschema.validate(value, schema)
    depth = 0
    while value.get("children"):
        value = value["children"][0]
        depth += 1
    assert depth <= 4
