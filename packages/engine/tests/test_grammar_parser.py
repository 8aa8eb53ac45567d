"""The GBNF parser: llama.cpp's grammars and parser cases (read from its source tree as data), its
error messages, and hostile grammars answered with a clear error in bounded time."""

from __future__ import annotations

import re
import time

import pytest
from grammar_cases import LLAMA_CPP_SRC, parser_cases

from llama_engine.grammar import (
    MAX_ELEMENTS,
    MAX_NESTING,
    MAX_REPETITION_THRESHOLD,
    ElementType,
    GrammarError,
    bind_tokens,
    parse_grammar,
)

PARSER_OK, PARSER_BAD = parser_cases()
GBNF_FILES = sorted((LLAMA_CPP_SRC / "grammars").glob("*.gbnf"))


def test_the_source_tree_has_the_cases() -> None:
    assert len(PARSER_OK) >= 15 and len(PARSER_BAD) >= 5 and len(GBNF_FILES) >= 8


@pytest.mark.parametrize("path", GBNF_FILES, ids=lambda p: p.name)
def test_every_grammar_of_llama_cpp_parses(path) -> None:
    g = parse_grammar(path.read_text(encoding="utf-8"))
    assert g.rules[g.root][-1] == (ElementType.END, 0)
    assert all(r and r[-1][0] == ElementType.END for r in g.rules)


def _count_over_limit(grammar: str) -> bool:
    return any(int(n) > MAX_REPETITION_THRESHOLD for n in re.findall(r"\{[0-9,]*?([0-9]+)\}", grammar))


@pytest.mark.parametrize("case", PARSER_OK, ids=lambda c: " ".join(c.grammar.split())[:50])
def test_rules_and_symbol_ids_equal_llama_cpp(case) -> None:
    if _count_over_limit(case.grammar):
        # llama.cpp reads a maximum above its bound as "no maximum" ({0,5000} as *); ours refuses every
        # count above the bound, naming it
        _fails_fast(case.grammar, f"a repetition count is at most {MAX_REPETITION_THRESHOLD}")
        return
    g = parse_grammar(case.grammar)
    assert g.symbol_ids == case.symbols
    flat = [(ElementType(t).name, v) for rule in g.rules for t, v in rule]
    assert flat == case.elements


@pytest.mark.parametrize("text", PARSER_BAD, ids=lambda t: " ".join(t.split())[:50])
def test_llama_cpp_failures_fail(text: str) -> None:
    with pytest.raises(GrammarError, match=r"^parse: error parsing grammar: "):
        parse_grammar(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("root ::= this is (not valid GBNF", "parse: error parsing grammar: expecting ')' at "),
        ('root ::= "abc', "parse: error parsing grammar: unexpected end of input"),
        ("root ::= [a-", "parse: error parsing grammar: unexpected end of input"),
        ('root ::= "\\q"', "parse: error parsing grammar: unknown escape at \\q"),
        ('root ::= "\\x4"', "parse: error parsing grammar: expecting 2 hex chars at 4"),
        ('root ::= "\\u12"', "parse: error parsing grammar: expecting 4 hex chars at 12"),
        ('root = "a"', "parse: error parsing grammar: expecting ::= at "),
        ('::= "a"', "parse: error parsing grammar: expecting name at ::="),
        ('root ::= "a" }', "parse: error parsing grammar: expecting newline or end at }"),
        ("root ::= *", "parse: error parsing grammar: expecting preceding item to */+/?/{ at "),
        ('root ::= "a"{x}', "parse: error parsing grammar: expecting an int at x}"),
        ('root ::= "a"{1;2}', "parse: error parsing grammar: expecting ',' at ;2}"),
        ('root ::= "a"{1,2', "parse: error parsing grammar: expecting '}' at "),
        ('root ::= "a"{3,1}', "parse: error parsing grammar: repetition maximum 1 is below its minimum 3"),
        ("root ::= <[12", "parse: error parsing grammar: expecting ']' at "),
        ("root ::= <[99999999999]>", "parse: error parsing grammar: parsed token id is too big"),
        ("root ::= foo", "parse: error parsing grammar: Undefined rule identifier 'foo'"),
        ('root ::= a\na ::= b\nb ::= "x" c', "parse: error parsing grammar: Undefined rule identifier 'c'"),
        ('rot ::= "a"', "grammar does not contain a 'root' symbol"),
        ("# only a comment\n", "parse: error parsing grammar: the grammar has no rules"),
        ("%llguidance {}\nstart: /a/", "failed to parse grammar: llguidance is not enabled"),
    ],
)
def test_error_messages(text: str, message: str) -> None:
    with pytest.raises(GrammarError) as e:
        parse_grammar(text)
    assert str(e.value).startswith(message)


def test_errors_say_where() -> None:
    with pytest.raises(GrammarError) as e:
        parse_grammar('root ::= "a"\nitem ::= ("b" | "c"\n')
    assert (e.value.line, e.value.column) == (3, 1)
    assert str(e.value).endswith("(line 3, column 1)")


@pytest.mark.parametrize(
    "text",
    [
        'root ::= "a" | root "a"',
        'root ::= asdf\nasdf ::= "a" | asdf "a"',
        'root ::= asdf\nasdf ::= "a" | foo "b"\nfoo ::= "c" | asdf "d" | "e"',
        'root ::= asdf\nasdf ::= "a" | foo "b"\nfoo ::= "c" | empty asdf "d" | "e"\nempty ::= "blah" | ',
    ],
)
def test_left_recursion_is_refused(text: str) -> None:
    with pytest.raises(GrammarError, match="left recursion detected for nonterminal at index"):
        parse_grammar(text)


def test_custom_root_symbol() -> None:
    with pytest.raises(GrammarError, match="does not contain a 'root' symbol"):
        parse_grammar('foobar ::= "foobar"')
    assert parse_grammar('foobar ::= "foobar"', root="foobar").root == 0


def test_syntax_forms() -> None:
    g = parse_grammar(
        '# comment\nroot ::= ( [^\\n\\]\\[] | "\\t\\r\\\\\\"" | [\\x41-\\u0042\\U0001F600] | . )* tok\n'
        "tok ::= <[7]> !<[8]> <think>  # trailing comment\n"
    )
    assert g.token_names == ("<think>",)
    bound = bind_tokens(g, lambda text: 42 if text == "<think>" else None)
    tok = bound.rules[bound.symbol_ids["tok"]]
    assert tok == (
        (ElementType.TOKEN, 7),
        (ElementType.TOKEN_NOT, 8),
        (ElementType.TOKEN, 42),
        (ElementType.END, 0),
    )
    with pytest.raises(GrammarError, match="invalid token '<think>'"):
        bind_tokens(g, lambda text: None)


def test_a_nul_ends_the_input_as_in_llama_cpp() -> None:
    assert parse_grammar('root ::= "a"\0 garbage').rules == parse_grammar('root ::= "a"').rules


# -- hostile grammars: a clear error, bounded time ------------------------------------------------------


def _fails_fast(text: str, match: str, seconds: float = 2.0) -> None:
    t0 = time.perf_counter()
    with pytest.raises(GrammarError, match=match):
        parse_grammar(text)
    assert time.perf_counter() - t0 < seconds


def test_60000_nested_parentheses() -> None:
    _fails_fast("root ::= " + "(" * 60000 + '"a"' + ")" * 60000, f"groups nest deeper than {MAX_NESTING}")
    _fails_fast("root ::= " + "(" * 60000, "nest deeper")
    depth = MAX_NESTING
    assert parse_grammar("root ::= " + "(" * depth + '"a"' + ")" * depth)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('root ::= "a"{5000}', "number of repetitions exceeds sane defaults"),
        ('root ::= "a"{99999999999999999999999}', "number of repetitions exceeds sane defaults"),
        ('root ::= ("a"{0,100}){0,100}', "exceeds sane defaults"),
        ('root ::= "' + "x" * 100_000 + '"{2000}', f"beyond {MAX_ELEMENTS} elements"),
        ('root ::= ("' + "x" * 300 + '"{2000} "b")', f"beyond {MAX_ELEMENTS} elements"),
    ],
)
def test_huge_repetitions(text: str, match: str) -> None:
    _fails_fast(text, match)


LIMIT = f"a repetition count is at most {MAX_REPETITION_THRESHOLD}"


@pytest.mark.parametrize(
    ("count", "got"),
    [
        ("{1000000}", "got 1000000"),
        ("{2001}", "got 2001"),
        ("{2001,}", "got 2001"),
        ("{0,2001}", "got 2001"),
        ("{0,2147483648}", "got 2147483648"),
        ("{1,18446744073709551616}", "got 18446744073709551616"),
        ("{" + "9" * 5000 + "}", "got a number of 5000 digits"),
        ("{0," + "9" * 100_000 + "}", "got a number of 100000 digits"),
    ],
)
def test_every_repetition_count_is_bounded(count: str, got: str) -> None:
    """`{n}`, `{m,}` and `{m,n}` alike: a count above the limit is refused, the maximum too (llama.cpp would
    read `{0,2147483648}` as `*`), before it is converted or expanded."""
    _fails_fast(f'root ::= "a"{count}', f"{LIMIT}, {got}")
    _fails_fast(f'root ::= ("a" | [b-c]){count} "d"', LIMIT)


@pytest.mark.parametrize("count", ["{2000}", "{2000,}", "{0,2000}", "{1999,2000}", "{0002000}"])
def test_repetition_counts_at_the_limit(count: str) -> None:
    assert parse_grammar(f'root ::= "a"{count}')


def test_long_rule_chains_cost_linear_time() -> None:
    # each rule refers to the next twice: a search without memo would take 2**n steps
    n = 20000
    chain = (
        "root ::= r0\n"
        + "".join(f"r{i} ::= r{i + 1} | r{i + 1} r{i + 1}\n" for i in range(n))
        + f'r{n} ::= "a"\n'
    )
    t0 = time.perf_counter()
    g = parse_grammar(chain)
    assert len(g.rules) == n + 2 and time.perf_counter() - t0 < 10
    _fails_fast(chain + f'r{n} ::= r0 "a"\n', "left recursion", seconds=10)
    _fails_fast("root ::= " + " ".join(f"u{i}" for i in range(20000)), "Undefined rule identifier 'u0'")
