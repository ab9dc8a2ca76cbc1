"""A JSON schema checked before it is compiled: every keyword is one the grammar engine
enforces (or an annotation that constrains nothing), `$ref`s point inside the document, and
its size and depth are bounded. llguidance refuses the keywords of JSON Schema it has not
implemented, but passes over a keyword it does not know (`"uniqueItem": true`, a typo, or
`contentEncoding`) as if it were not there: an answer would then be constrained by less than
the client asked for. So the schema is walked here, and anything else is refused by name and
JSON path (never failing open)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from registry.errors import ZooError

MAX_DEPTH = 64  # nested subschemas; OpenAI's structured outputs allow 10 levels
MAX_NODES = 10_000  # subschemas in all; OpenAI allows 5,000 properties

# The keywords llguidance's JSON compiler enforces (parser/src/json/README.md, 1.9), by how
# their value holds subschemas.
ONE_SCHEMA = {"additionalProperties", "items"}
SCHEMA_LISTS = {"anyOf", "oneOf", "allOf", "prefixItems"}
SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions"}
VALUES = {"type", "enum", "const", "required", "minItems", "maxItems", "minLength",
          "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
          "exclusiveMaximum", "multipleOf", "minProperties", "maxProperties", "$ref"}
# Annotations: they say what a value means and constrain nothing.
ANNOTATIONS = {"title", "description", "examples", "default", "$schema", "$id", "$comment",
               "deprecated", "readOnly", "writeOnly", "discriminator"}
KNOWN = ONE_SCHEMA | SCHEMA_LISTS | SCHEMA_MAPS | VALUES | ANNOTATIONS


class SchemaError(ZooError):
    """A schema the engine cannot enforce; `where` is its JSON path ($.properties.a)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{message} at {where}")
        self.where = where


def check_schema(schema: Any) -> None:
    """Refuse (SchemaError) what cannot be enforced, before anything is compiled."""
    nodes = 0
    for where, node, depth in _subschemas(schema, "$", 0):
        nodes += 1
        if nodes > MAX_NODES:
            raise SchemaError("$", f"more than {MAX_NODES} subschemas")
        if depth > MAX_DEPTH:
            raise SchemaError(where, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise SchemaError(where, "expected a schema (an object or true/false)")
        for keyword, value in node.items():
            if keyword not in KNOWN:
                raise SchemaError(f"{where}.{keyword}",
                                  f"the keyword {keyword!r} cannot be enforced")
            if keyword == "$ref" and not (isinstance(value, str) and value.startswith("#")):
                raise SchemaError(f"{where}.$ref", f"$ref {str(value)[:80]!r} is not inside "
                                  "the schema (only '#/...' references are followed)")


def _subschemas(node: Any, where: str, depth: int) -> Iterator[tuple[str, Any, int]]:
    """Every subschema with its JSON path and depth, the node first. Iterative: a schema
    nested 10,000 deep is refused at its 65th level, not by Python's recursion limit."""
    stack = [(where, node, depth)]
    while stack:
        where, node, depth = stack.pop()
        yield where, node, depth
        if not isinstance(node, dict) or depth > MAX_DEPTH:
            continue
        children: list[tuple[str, Any, int]] = []
        for keyword, value in node.items():
            path = f"{where}.{keyword}"
            if keyword in ONE_SCHEMA and isinstance(value, dict | bool):
                children.append((path, value, depth + 1))
            elif keyword in SCHEMA_LISTS or keyword == "items" and isinstance(value, list):
                if not isinstance(value, list):
                    raise SchemaError(path, "expected a list of schemas")
                children += [(f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value)]
            elif keyword in SCHEMA_MAPS:
                if not isinstance(value, dict):
                    raise SchemaError(path, "expected an object of schemas")
                children += [(f"{path}.{name}", item, depth + 1) for name, item in value.items()]
        stack.extend(reversed(children))
