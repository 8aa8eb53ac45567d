"""Sampled structured output: SmolLM2 at temperature 1, several seeds, a dozen varied schemas; every
reply parses as JSON and validates against its schema with format checking."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest

S = {"type": "string", "maxLength": 12}
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 3},
    {"enum": ["red", "green", "blue", 7, None]},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "email"},
    {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
    {"type": "number", "minimum": 0, "maximum": 1},
    {"type": ["boolean", "null"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}, "required": ["ok"], "additionalProperties": False},
    {"anyOf": [{"type": "integer", "exclusiveMinimum": 100, "maximum": 200}, {"const": "none"}]},
    {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"], "additionalProperties": False}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"type": "string", "minLength": 1, "maxLength": 4}}, "required": ["a", "b"], "additionalProperties": False},
]  # fmt: skip
SEEDS = (1, 2, 3)


def _sample(client: httpx.Client, schema: dict[str, Any], seed: int) -> str:
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Reply with a JSON value."}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema, "strict": True}},
            "temperature": 1.0,
            "seed": seed,
            "max_tokens": 160,
        },
    )
    assert r.status_code == 200, r.text[:300]
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    return choice["message"]["content"]


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_sampled_output_validates(client: httpx.Client, index: int) -> None:
    schema = SCHEMAS[index]
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    with ThreadPoolExecutor(len(SEEDS)) as pool:
        texts = list(pool.map(lambda seed: _sample(client, schema, seed), SEEDS))
    for text in texts:
        value = json.loads(text)
        errors = [e.message for e in validator.iter_errors(value)]
        assert not errors, (text, errors)
