"""A corpus of JSON schemas for structured output (tests/test_structured_output.py), after
JSONSchemaBench's categories: flat and nested objects, optional and required properties, arrays with
bounds and tuples, enums and consts, integers and numbers with bounds, strings with lengths, patterns
and formats, unions, $defs/$ref (recursion included). Hand-written schemas first, then generated ones
from a fixed seed: the same corpus on every run.

Every schema here is one the runtime must accept; each answer it gives must validate against it.
"""

from __future__ import annotations

import copy
import random

# Leaves: the value schemas objects and arrays are made of.
STRINGS = [
    {"type": "string"},
    {"type": "string", "maxLength": 5},
    {"type": "string", "minLength": 2, "maxLength": 6},
    {"type": "string", "minLength": 3},
    {"type": "string", "pattern": "^[a-z]{2,5}$"},
    {"type": "string", "pattern": "^[A-Z][a-z]{0,6}$"},
    {"type": "string", "pattern": "^\\d{3}-\\d{4}$"},
    {"type": "string", "pattern": "^(red|green|blue)$"},
    {"type": "string", "pattern": "^[a-f0-9]{4}$"},
    {"type": "string", "pattern": "^item_[0-9]+$"},
    {"type": "string", "enum": ["low", "medium", "high"]},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "ipv4"},
    {"type": "string", "format": "uuid"},
]
INTEGERS = [
    {"type": "integer"},
    {"type": "integer", "minimum": 0, "maximum": 100},
    {"type": "integer", "minimum": -50, "maximum": -10},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
    {"type": "integer", "minimum": 1000},
    {"type": "integer", "maximum": 5},
    {"type": "integer", "minimum": 0, "maximum": 60, "multipleOf": 5},
]
NUMBERS = [
    {"type": "number"},
    {"type": "number", "minimum": 0, "maximum": 1},
    {"type": "number", "minimum": -10.5, "maximum": 10.5},
    {"type": "number", "exclusiveMinimum": 0},
    {"type": "number", "minimum": 100, "maximum": 200},
]
OTHERS = [
    {"type": "boolean"},
    {"type": "null"},
    {"enum": [1, 2, 3]},
    {"enum": ["x", 1, None, True]},
    {"const": "fixed"},
    {"const": 42},
    {"type": ["string", "null"], "maxLength": 4},
    {"type": ["integer", "boolean"]},
    {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0}]},
    {"anyOf": [{"type": "null"}, {"type": "number", "maximum": 0}]},
]
LEAVES = STRINGS + INTEGERS + NUMBERS + OTHERS

NAMES = ["id", "name", "age", "score", "tags", "kind", "city", "ok", "note", "code", "level", "when"]


def hand_written() -> list[dict]:
    point = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}
    return [
        # Nested objects, every level required.
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 8},
                        "address": {
                            "type": "object",
                            "properties": {
                                "city": {"type": "string"},
                                "zip": {"type": "string", "pattern": "^\\d{5}$"},
                            },
                            "required": ["city", "zip"],
                        },
                    },
                    "required": ["name", "address"],
                }
            },
            "required": ["user"],
        },
        # $defs / $ref, used twice.
        {
            "$defs": {"point": point},
            "type": "object",
            "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
            "required": ["from", "to"],
        },
        # Draft-7 "definitions" and a $ref to the root's own subtree.
        {
            "definitions": {"tag": {"type": "string", "enum": ["a", "b", "c"]}},
            "type": "array",
            "items": {"$ref": "#/definitions/tag"},
            "minItems": 1,
            "maxItems": 4,
        },
        # Recursion: a linked list.
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "value": {"type": "integer", "minimum": 0, "maximum": 9},
                        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
                    },
                    "required": ["value", "next"],
                }
            },
            "$ref": "#/$defs/node",
        },
        # Recursion: a tree with bounded children.
        {
            "$defs": {
                "tree": {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string", "maxLength": 3},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2},
                    },
                    "required": ["label"],
                }
            },
            "$ref": "#/$defs/tree",
        },
        # Tuples.
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 4}], "items": False},
        {
            "type": "array",
            "prefixItems": [{"const": "point"}, {"type": "number"}, {"type": "number"}],
            "items": False,
            "minItems": 3,
        },
        # Arrays of objects with bounds.
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "qty": {"type": "integer", "minimum": 1},
                },
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
            "minItems": 2,
            "maxItems": 3,
        },
        # Properties counts.
        {
            "type": "object",
            "properties": {k: {"type": "integer", "maximum": 9} for k in ["a", "b", "c", "d"]},
            "minProperties": 2,
            "maxProperties": 3,
        },
        # Everything optional.
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}}},
        # An empty object only.
        {"type": "object", "properties": {}, "additionalProperties": False},
        # Top-level scalars.
        {"type": "string", "pattern": "^(yes|no)$"},
        {"type": "integer", "minimum": 10, "maximum": 20},
        {"type": "boolean"},
        {"enum": ["alpha", "beta", 3, None]},
        # Union of objects.
        {
            "anyOf": [
                {"type": "object", "properties": {"cat": {"const": "meow"}}, "required": ["cat"]},
                {"type": "object", "properties": {"dog": {"const": "woof"}}, "required": ["dog"]},
            ]
        },
        # Annotations that ask nothing.
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Annotated",
            "description": "fields with descriptions and defaults",
            "type": "object",
            "properties": {"n": {"type": "integer", "description": "a count", "default": 1, "examples": [3]}},
            "required": ["n"],
        },
        # Any character but a few, JSON escapes included.
        {
            "type": "object",
            "properties": {"text": {"type": "string", "pattern": "^[^a-z]{1,6}$"}},
            "required": ["text"],
        },
        # Nested arrays.
        {
            "type": "array",
            "items": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 3},
            "maxItems": 3,
        },
        # An e-mail (its quoted local part can run long: kept out of the generated leaves).
        {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}, "required": ["to"]},
        # Property names by pattern.
        {"type": "object", "patternProperties": {"^x_[a-z]$": {"type": "integer"}}, "additionalProperties": False},
        {"type": "object", "propertyNames": {"pattern": "^[a-z]{2}$"}, "additionalProperties": {"type": "boolean"}},
        # oneOf whose branches cannot overlap.
        {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
        # multipleOf on an unbounded integer.
        {"type": "integer", "multipleOf": 7},
        # allOf with one member (the form xgrammar merges).
        {"allOf": [{"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}]},
    ]


def _object(rng: random.Random, depth: int) -> dict:
    names = rng.sample(NAMES, rng.randint(1, 5))
    properties = {name: _value(rng, depth + 1) for name in names}
    schema = {"type": "object", "properties": properties}
    required = [n for n in names if rng.random() < 0.6]
    if required:
        schema["required"] = required
    if rng.random() < 0.3:
        schema["additionalProperties"] = False
    return schema


def _array(rng: random.Random, depth: int) -> dict:
    schema = {"type": "array", "items": _value(rng, depth + 1)}
    low = rng.choice([0, 0, 1, 2])
    schema["minItems"] = low
    if rng.random() < 0.8:
        schema["maxItems"] = low + rng.randint(0, 3)
    return schema


def _value(rng: random.Random, depth: int) -> dict:
    roll = rng.random()
    if depth < 3 and roll < 0.18:
        return _object(rng, depth)
    if depth < 3 and roll < 0.3:
        return _array(rng, depth)
    return copy.deepcopy(rng.choice(LEAVES))


def _with_defs(rng: random.Random) -> dict:
    """An object whose properties reuse definitions through $ref."""
    defs = {f"d{i}": _value(rng, 1) for i in range(rng.randint(1, 3))}
    names = rng.sample(NAMES, rng.randint(2, 4))
    properties = {name: {"$ref": f"#/$defs/{rng.choice(sorted(defs))}"} for name in names}
    return {"$defs": defs, "type": "object", "properties": properties, "required": names[: rng.randint(1, len(names))]}


def generated(count: int, seed: int = 59) -> list[dict]:
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        roll = rng.random()
        out.append(_with_defs(rng) if roll < 0.2 else _array(rng, 1) if roll < 0.35 else _object(rng, 0))
    return out


def corpus() -> list[dict]:
    """The whole corpus: at least 200 schemas."""
    return hand_written() + generated(200)
