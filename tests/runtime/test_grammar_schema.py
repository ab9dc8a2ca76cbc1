"""The JSON schema check before compiling (issue 45): what the grammar engine does not enforce
is refused by keyword and JSON path, never passed over; size and depth are bounded without
recursion."""

from __future__ import annotations

import pytest

from runtime.grammar.schema import MAX_DEPTH, MAX_NODES, SchemaError, check_schema


@pytest.mark.parametrize(("schema", "where"), [
    ({"type": "object", "properties": {"a": {"type": "string", "minLenght": 2}}},
     "$.properties.a.minLenght"),  # a typo llguidance would pass over
    ({"items": [{"type": "string"}, {"uniqueItems": True}]}, "$.items[1].uniqueItems"),
    ({"anyOf": [{"type": "string"}, {"not": {"type": "null"}}]}, "$.anyOf[1].not"),
    ({"$defs": {"a": {"if": {}}}, "$ref": "#/$defs/a"}, "$.$defs.a.if"),
    ({"$ref": "https://example.com/s.json"}, "$.$ref"),
    ({"properties": {"a": 3}}, "$.properties.a"),
])
def test_what_cannot_be_enforced_is_refused_by_path(schema: dict, where: str) -> None:
    with pytest.raises(SchemaError) as refused:
        check_schema(schema)
    assert refused.value.where == where, str(refused.value)


def test_what_can_be_enforced_passes() -> None:
    check_schema({"type": "object", "title": "T", "description": "d", "properties": {
        "a": {"type": "array", "items": {"enum": [1, 2]}, "minItems": 1, "maxItems": 3},
        "b": {"anyOf": [{"type": "string", "pattern": "^x", "format": "date"},
                        {"$ref": "#/$defs/n"}]}},
        "required": ["a"], "additionalProperties": False,
        "$defs": {"n": {"type": "integer", "minimum": 0, "exclusiveMaximum": 9}}})


def test_depth_and_size_are_bounded_without_recursion() -> None:
    deep: dict = {"type": "object"}
    node = deep
    for _ in range(10_000):
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    with pytest.raises(SchemaError, match=f"deeper than {MAX_DEPTH} levels"):
        check_schema(deep)
    wide = {"type": "object",
            "properties": {f"p{i}": {"type": "string"} for i in range(MAX_NODES)}}
    with pytest.raises(SchemaError, match=f"more than {MAX_NODES} subschemas"):
        check_schema(wide)
