"""A JSON-schema subset -> one regular expression for its compact JSON, and a checker for the same subset.

The subset: an object with `properties` and `required` (every property required, written in
the order the schema lists them), whose values are strings (`maxLength`, default 16; printable
ASCII without quote or backslash), integers (up to 9 digits), booleans, `enum`s of strings or
integers, arrays of those (`maxItems`, default 4), and nested objects. Output is compact
(`{"a":1,"b":"x"}`): no whitespace between tokens, as with vLLM's `disable_any_whitespace`.
Lengths are bounded, so the automaton is finite and every constrained sample ends.

Turning a schema into a regex and the regex into an automaton is what Outlines does
(`build_regex_from_schema`); XGrammar and llguidance compile a grammar instead, which also
covers recursion, but the mask they produce per step means the same thing.
"""

from __future__ import annotations

import json
from typing import Any

from labs.structured.regex import escape

STRING_CHARS = r"[ !#-\[\]-~]"  # printable ASCII except " (34) and \ (92)
INTEGER = r"-?(0|[1-9]\d{0,8})"
DEFAULT_MAX_LENGTH = 16
DEFAULT_MAX_ITEMS = 4


class SchemaError(ValueError):
    """A schema outside the subset; the message names the path and what is allowed."""


def to_regex(schema: dict, path: str = "$") -> str:
    if not isinstance(schema, dict):
        raise SchemaError(f"{path}: a schema is an object, got {type(schema).__name__}")
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values or not all(
                isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in values):
            raise SchemaError(f"{path}: enum must be a non-empty list of strings or integers")
        for v in values:
            if isinstance(v, str) and ('"' in v or "\\" in v or not v.isascii()):
                raise SchemaError(f"{path}: enum strings are ASCII without quotes or backslashes")
        return "(" + "|".join(escape(json.dumps(v)) for v in values) + ")"
    kind = schema.get("type")
    if kind == "string":
        n = schema.get("maxLength", DEFAULT_MAX_LENGTH)
        lo = schema.get("minLength", 0)
        if not (isinstance(n, int) and isinstance(lo, int) and 0 <= lo <= n <= 64):
            raise SchemaError(f"{path}: need 0 <= minLength <= maxLength <= 64")
        return f'"{STRING_CHARS}{{{lo},{n}}}"'
    if kind == "integer":
        return INTEGER
    if kind == "boolean":
        return "(true|false)"
    if kind == "array":
        n = schema.get("maxItems", DEFAULT_MAX_ITEMS)
        if not isinstance(n, int) or not 1 <= n <= 16:
            raise SchemaError(f"{path}: maxItems must be 1..16")
        item = to_regex(schema.get("items", {}), path + "[]")
        return rf"\[({item}(,{item}){{0,{n - 1}}})?\]"
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            raise SchemaError(f"{path}: an object needs properties")
        if sorted(schema.get("required", [])) != sorted(props):
            raise SchemaError(f"{path}: every property must be required (the subset has no optional ones)")
        fields = [escape(json.dumps(name)) + ":" + to_regex(sub, f"{path}.{name}") for name, sub in props.items()]
        return r"\{" + ",".join(fields) + r"\}"
    raise SchemaError(f"{path}: type {kind!r} is not in the subset (object, string, integer, boolean, array, enum)")


def problems(value: Any, schema: dict, path: str = "$") -> list[str]:
    """What is wrong with a parsed value against the schema (empty when it conforms), checked from the JSON."""
    if "enum" in schema:
        return [] if value in schema["enum"] and type(value) in {type(v) for v in schema["enum"]} else [
            f"{path}: {value!r} is not one of {schema['enum']}"]
    kind = schema.get("type")
    if kind == "string":
        if not isinstance(value, str):
            return [f"{path}: expected a string"]
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", DEFAULT_MAX_LENGTH):
            return [f"{path}: length {len(value)} out of bounds"]
        return []
    if kind == "integer":
        return [] if isinstance(value, int) and not isinstance(value, bool) else [f"{path}: expected an integer"]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{path}: expected true or false"]
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: expected an array"]
        if len(value) > schema.get("maxItems", DEFAULT_MAX_ITEMS):
            return [f"{path}: more than maxItems"]
        return [p for i, v in enumerate(value) for p in problems(v, schema.get("items", {}), f"{path}[{i}]")]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: expected an object"]
        out = [f"{path}: missing {k}" for k in schema["properties"] if k not in value]
        out += [f"{path}: unexpected {k}" for k in value if k not in schema["properties"]]
        return out + [p for k, sub in schema["properties"].items() if k in value
                      for p in problems(value[k], sub, f"{path}.{k}")]
    return [f"{path}: unsupported schema"]


def conforms(text: str, schema: dict) -> tuple[bool, bool]:
    """(parses as JSON, and conforms to the schema)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False, False
    return True, not problems(value, schema)
