"""The converter against llama.cpp's own cases (tests/test-json-schema-to-grammar.cpp, read at test time
from $LLAMA_CPP_SRC): the same grammar text, or a refusal where llama.cpp fails.

A few cases differ on purpose, each for a reason listed in `DIFFERENT` (llama.cpp's grammar there accepts
text that is not valid JSON or values the schema rejects); for those the test checks what we do instead.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from llama_engine.grammar import parse_grammar
from llama_engine.grammar.schema import SchemaError, json_schema_to_grammar

SRC = Path(os.environ.get("LLAMA_CPP_SRC", Path.home() / ".cache/llama-py/llama-cpp-src-11434.0.0"))
CASES_FILE = SRC / "tests" / "test-json-schema-to-grammar.cpp"

# case name -> (why our grammar differs, a check of what we produce instead)
DIFFERENT: dict[str, tuple[str, Callable[[str], bool]]] = {
    "exotic formats": (
        "dates: only the days each month has, years from 1000",
        lambda g: '"02" "-"' in g and "[1-9] [0-9]{3}" in g,
    ),
    "regexp quote": (
        'a " in a pattern is written escaped inside the JSON string',
        lambda g: 'root ::= "\\"" ("\\\\\\"") "\\""' in g,
    ),
    "regexp": (
        "`.` never produces a raw quote, backslash or control character",
        lambda g: 'dot ::= [^"\\\\\\x00-\\x1F]' in g,
    ),
    "unanchored regexp": (
        "an unanchored pattern is matched anywhere (llama.cpp drops it for any string)",
        lambda g: 'root ::= "\\"" char* ([0-9]+) char* "\\""' in g,
    ),
    "regexp with unsupported shorthand": (
        "\\w is honoured as [a-zA-Z0-9_] (llama.cpp drops the pattern)",
        lambda g: "root-1{3,3} [a-zA-Z0-9_]" in g,
    ),
    "unsupported regexp in a property": (
        "lookahead is refused (llama.cpp drops the pattern)",
        lambda g: False,
    ),
}


def _trim(text: str) -> str:
    """llama.cpp's comparison: strip the ends and every line's indentation."""
    return re.sub(r"(^|\n)[ \t]+", r"\1", text.strip(" \n\r\t"))


def _raw_strings(block: str) -> list[str]:
    """The C++ string literals of one test block: raw R\"\"\"(...)\"\"\" strings and plain "..." ones."""
    out = []
    for m in re.finditer(r'R"""\((.*?)\)"""|"((?:[^"\\\n]|\\.)*)"', block, re.S):
        out.append(m.group(1) if m.group(1) is not None else json.loads('"' + m.group(2) + '"'))
    return out


def load_cases() -> list[tuple[str, bool, str, str]]:
    """(name, expect success, schema text, expected grammar) for every `test({...})` in the file."""
    text = CASES_FILE.read_text()
    body = text[text.index("static void test_all") : text.index("int main()")]
    cases = []
    for m in re.finditer(r"test\(\{\s*(SUCCESS|FAILURE),(.*?)\n    \}\);", body, re.S):
        strings = _raw_strings(m.group(2))
        name, schema, grammar = strings[0], strings[1], strings[2] if len(strings) > 2 else ""
        cases.append((name, m.group(1) == "SUCCESS", schema, grammar))
    return cases


CASES = load_cases()


def test_cases_found() -> None:
    assert len(CASES) >= 80
    assert sum(1 for c in CASES if not c[1]) >= 3


@pytest.mark.parametrize(("name", "ok", "schema", "expected"), CASES, ids=[c[0] for c in CASES])
def test_llamacpp_case(name: str, ok: bool, schema: str, expected: str) -> None:
    try:
        grammar = json_schema_to_grammar(json.loads(schema))
    except SchemaError:
        assert not ok or (name in DIFFERENT and not DIFFERENT[name][1]("")), name
        return
    assert ok, f"llama.cpp refuses {name!r}"
    parse_grammar(grammar)
    if name in DIFFERENT:
        assert _trim(grammar) != _trim(expected)
        assert DIFFERENT[name][1](grammar), grammar
    else:
        assert _trim(grammar) == _trim(expected)


def test_exact_count() -> None:
    """How many of llama.cpp's cases give exactly its grammar (or its refusal)."""
    assert len(CASES) - len(DIFFERENT) >= 75
    assert set(DIFFERENT) <= {c[0] for c in CASES}
