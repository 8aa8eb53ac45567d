"""JSON schema -> grammar: the language of each grammar (valid JSON accepted, invalid rejected, checked
with the grammar matcher), the features llama.cpp ignores (refused or honoured), hostile schemas."""

from __future__ import annotations

import json
import time
from typing import Any

import jsonschema
import pytest

from llama_engine.grammar import parse_grammar
from llama_engine.grammar.compiled import DEAD, CompiledGrammar
from llama_engine.grammar.schema import SchemaError, json_schema_to_grammar


def accepts(schema: Any, text: str) -> bool:
    g = CompiledGrammar(parse_grammar(json_schema_to_grammar(schema)))
    sid = g.walk(g.initial, [ord(c) for c in text])
    return sid != DEAD and g.can_end[sid]


def _valid(schema: Any, value: Any) -> bool:
    v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return v.is_valid(value)


# (schema, texts the grammar must accept, texts it must reject); every accepted text is also valid
LANGUAGE: list[tuple[dict[str, Any], list[str], list[str]]] = [
    ({"type": "number", "minimum": 0, "maximum": 1}, ["0", "1", "0.5", "1.000", "0.25"], ["-1", "1.5", "2", "1e3"]),
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, ["0.1", "5", "9.99"], ["0", "10", "-3", "0.0"]),
    ({"type": "number", "minimum": -2.5, "maximum": -1}, ["-2", "-1", "-1.5", "-1.0"], ["-3", "0", "-0.5", "-1.5e0"]),
    ({"type": "number", "minimum": 3}, ["3", "3.5", "12345"], ["2.9", "-3", "0"]),
    ({"type": "number", "maximum": -3, "exclusiveMaximum": -3}, ["-4", "-3.5"], ["-3", "0", "3"]),
    ({"type": "integer", "minimum": 5, "exclusiveMinimum": 7}, ["8", "100"], ["7", "5", "6"]),
    ({"type": "string", "pattern": '^a"b\\\\c$'}, ['"a\\"b\\\\c"'], ['"a"b\\c"', '"a\\"b\\c"']),
    ({"type": "string", "pattern": "^\\d{3}-\\w+$"}, ['"123-ab_9"'], ['"12-ab"', '"123-"']),
    ({"type": "string", "pattern": "^[^a]+$"}, ['"bcd"', '"xyz"'], ['"a"', '"b\\"c"', '"ba"']),
    ({"type": "string", "pattern": "^[ -~]{2}$"}, ['"ab"', '"\\"x"', '"\\\\!"'], ['"a"b"', '"abc"']),
    ({"type": "string", "pattern": "ab"}, ['"ab"', '"xxabyy"'], ['"a"', '"ba"']),
    ({"type": "string", "pattern": "^(?P<x>ab)+?$"}, ['"abab"'], ['"aba"', '""']),
    ({"type": "string", "format": "date"}, ['"2024-02-28"', '"1999-12-31"'], ['"2024-02-30"', '"0000-01-01"', '"2024-04-31"']),
    ({"type": "string", "format": "email"}, ['"a.b@example.com"'], ['"ab"', '"@x"']),
    ({"type": "string", "format": "ipv4"}, ['"192.168.0.255"'], ['"256.1.1.1"', '"1.2.3"']),
    ({"type": "string", "format": "uri"}, ['"https://example.org/a/b"'], ['"example.org"']),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "minProperties": 1},
     ['{"a": 1}'], ["{}", '{"b": 1}']),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": {"type": "boolean"}},
     ['["x", 1]'], ['["x"]', '[1, "x"]']),
    ({"type": ["string", "null"], "maxLength": 2}, ['"ab"', "null"], ['"abc"', "1"]),
    ({"enum": ["a", 1, None], "type": "string"}, ['"a"'], ["1", "null"]),
    ({"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}},
                                         "additionalProperties": False}}},
     ['{"next": {"next": {}}}', "{}"], ['{"x": 1}']),
    (True, ["1", '{"a": [null]}'], ["{", "nul"]),
    ({"properties": {"a": True}}, ['{"a": [1]}', "{}"], ['{"b": 1}']),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "good", "bad"), LANGUAGE, ids=[str(i) for i in range(len(LANGUAGE))])
def test_language(schema: Any, good: list[str], bad: list[str]) -> None:
    for text in good:
        assert _valid(schema, json.loads(text)), text
        assert accepts(schema, text), text
    for text in bad:
        assert not accepts(schema, text), text


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"type": "number", "multipleOf": 2}, "multipleOf"),
    ({"not": {"type": "string"}}, "'not'"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "contains": {"type": "integer"}}, "contains"),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, "'if'"),
    ({"type": "string", "format": "ipv6"}, "ipv6"),
    ({"type": "string", "pattern": "^(?=a)a$"}, "lookaround"),
    ({"type": "string", "pattern": "^(a)\\1$"}, "escape \\1"),
    ({"type": "string", "pattern": "^\\bword$"}, "escape \\b"),
    ({"type": "string", "pattern": "^a++$"}, "possessive"),
    ({"type": "string", "pattern": "^a{5000}$"}, "repetition count"),
    ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}, "pattern beside"),
    ({"type": "object", "properties": {"a": {}}, "minProperties": 1}, "minProperties"),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 1}, "maxProperties"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "'b' is not in properties"),
    ({"$ref": "#/$defs/a", "minLength": 2, "$defs": {"a": {"type": "string"}}}, "$ref beside minLength"),
    ({"anyOf": [{"type": "string"}], "required": ["a"]}, "anyOf beside required"),
    ({"$ref": "https://example.com/s.json"}, "only references into the same document"),
    ({"$ref": "#/$defs/missing"}, "cannot resolve"),
    ({"type": "kaboom"}, "unrecognized type"),
    ({"type": "integer", "minimum": 10**20}, "digits"),
    ({"type": "string", "maxLength": 10**6}, "maxLength"),
    ({"allOf": [{"type": "string"}, {"minLength": 2}]}, "allOf"),
    (False, "accepts nothing"),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("schema", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_refused(schema: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=None) as e:
        json_schema_to_grammar(schema)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "string", "minLength": 2001}, "minLength 2001 is over the supported 2000"),
        ({"type": "string", "maxLength": 2147483648}, "maxLength 2147483648 is over the supported 2000"),
        ({"type": "string", "maxLength": 10**50}, "maxLength of 51 digits is over the supported 2000"),
        ({"type": "array", "minItems": 1000000}, "minItems 1000000 is over the supported 2000"),
        ({"type": "array", "maxItems": 2147483648}, "maxItems 2147483648 is over the supported 2000"),
        ({"type": "array", "maxItems": 1e300}, "maxItems of 301 digits is over the supported 2000"),
        ({"type": "string", "pattern": "^a{0,2147483648}$"}, "repetition count over 2000"),
        ({"type": "string", "pattern": "^a{2001,}$"}, "repetition count over 2000"),
        ({"type": "string", "pattern": "^a{" + "9" * 5000 + "}$"}, "repetition count over 2000"),
        ({"type": "string", "pattern": "^a{\u00b2}$"}, "invalid repetition"),
    ],
)
def test_counts_are_bounded(schema: Any, message: str) -> None:
    """Every count the converter writes as a repetition is held to the grammar parser's bound (and named)
    before anything is written, so a schema never yields a grammar the parser refuses or expands far."""
    t0 = time.monotonic()
    with pytest.raises(SchemaError) as e:
        json_schema_to_grammar(schema)
    assert message in str(e.value) and time.monotonic() - t0 < 1


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "minLength": 2000, "maxLength": 2000},
        {"type": "array", "items": {"type": "integer"}, "minItems": 2000},
        {"type": "string", "pattern": "^a{0,2000}$"},
    ],
)
def test_counts_at_the_bound_parse(schema: Any) -> None:
    assert parse_grammar(json_schema_to_grammar(schema))


def test_hostile_schemas_bounded() -> None:
    deep: Any = {"type": "string"}
    for _ in range(100_000):
        deep = {"type": "array", "items": deep}
    t0 = time.monotonic()
    with pytest.raises(SchemaError, match="deeper"):
        json_schema_to_grammar(deep)
    with pytest.raises(SchemaError, match="nesting too deep"):
        json_schema_to_grammar({"type": "string", "pattern": "^" + "(" * 500 + "a" + ")" * 500 + "$"})
    big = {"type": "object", "properties": {f"p{i}": {"enum": list(range(200))} for i in range(2000)}}
    with pytest.raises(SchemaError, match="characters"):
        json_schema_to_grammar(big)
    assert time.monotonic() - t0 < 10


def test_typical_schema_builds_in_milliseconds() -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "format": "email"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"pattern": "^\\d{5}$"}},
            },
        },
        "required": ["name", "age"],
    }
    json_schema_to_grammar(schema)
    t0 = time.perf_counter()
    for _ in range(20):
        parse_grammar(json_schema_to_grammar(schema))
    assert (time.perf_counter() - t0) / 20 < 0.05
