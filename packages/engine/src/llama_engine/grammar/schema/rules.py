"""The building blocks of JSON grammars: primitive rules, format rules, literals, repetitions, integer
ranges and "a string that is none of these" (llama.cpp's `json-schema-to-grammar.cpp` counterparts).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "FORMAT_RULES",
    "PRIMITIVE_RULES",
    "RESERVED_NAMES",
    "SPACE_RULE",
    "SchemaError",
    "constant",
    "format_literal",
    "min_max_int",
    "not_strings",
    "repetition",
]

INT_MAX = 2**31 - 1  # "no maximum" for repetitions (llama.cpp uses INT_MAX)


class SchemaError(ValueError):
    """A JSON schema that cannot be turned into a grammar that accepts exactly what it allows (or less);
    the message names the feature."""


SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

# name -> (rule text, names of the rules it uses)
PRIMITIVE_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "boolean": ('("true" | "false")', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "number": (
        '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
        ("integral-part", "decimal-part"),
    ),
    "integer": ('("-"? integral-part)', ("integral-part",)),
    "value": (
        "object | array | string | number | boolean | null",
        ("object", "array", "string", "number", "boolean", "null"),
    ),
    "object": (
        '"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
        ("string", "value"),
    ),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": (
        '"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
        '[0-9a-fA-F]{12} "\\""',
        (),
    ),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "null": ('"null"', ()),
}

# The date rule allows only the days each month has (February to 28) and years from 1000: llama.cpp's
# `[0-9]{4} ... "3" [0-1]` admits 0000-02-31, which no date validator accepts.
_DAY31 = '( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )'
_DAY30 = '( "0" [1-9] | [1-2] [0-9] | "30" )'
_DAY28 = '( "0" [1-9] | "1" [0-9] | "2" [0-8] )'
_DATE = (
    f'[1-9] [0-9]{{3}} "-" ( ( "0" [13578] | "1" [02] ) "-" {_DAY31} | ( "0" [469] | "11" ) "-" {_DAY30} '
    f'| "02" "-" {_DAY28} )'
)
_HOST_LABEL = "[a-z0-9]{1,20}"  # no hyphens: unambiguous, so the matcher keeps one stack per step
FORMAT_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "date": (_DATE, ()),
    "time": (
        '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
        '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
        (),
    ),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": ('"\\"" date "\\""', ("date",)),
    "time-string": ('"\\"" time "\\""', ("time",)),
    "date-time-string": ('"\\"" date-time "\\""', ("date-time",)),
    # formats llama.cpp leaves unconstrained, as a safe subset of each
    "hostname": (f'{_HOST_LABEL} ("." {_HOST_LABEL}){{0,4}}', ()),
    "hostname-string": ('"\\"" hostname "\\""', ("hostname",)),
    "email-string": (
        '"\\"" [a-zA-Z0-9_+]{1,20} ("." [a-zA-Z0-9_+]{1,20}){0,2} "@" hostname "\\""',
        ("hostname",),
    ),
    "ipv4-octet": ('[0-9] | [1-9] [0-9] | "1" [0-9] [0-9] | "2" [0-4] [0-9] | "25" [0-5]', ()),
    "ipv4-string": ('"\\"" ipv4-octet ("." ipv4-octet){3} "\\""', ("ipv4-octet",)),
    "uri-string": (
        '"\\"" ("https" | "http") "://" hostname ("/" [a-zA-Z0-9_.~-]{0,32}){0,8} "\\""',
        ("hostname",),
    ),
}

RESERVED_NAMES = frozenset({"root", *PRIMITIVE_RULES, *FORMAT_RULES})

_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
_LITERAL_ESCAPE_RE = re.compile(r'[\r\n"\\]')


def format_literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    return '"' + _LITERAL_ESCAPE_RE.sub(lambda m: _LITERAL_ESCAPES[m.group(0)], text) + '"'


def dump_json(value: Any) -> str:
    """Compact JSON text, as nlohmann's `dump()` writes it (UTF-8 kept, insertion order)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def constant(value: Any) -> str:
    """The literal rule for one JSON value (`const`, an `enum` member)."""
    return format_literal(dump_json(value))


def repetition(item: str, min_items: int, max_items: int, separator: str = "") -> str:
    """`item` repeated min..max times (max INT_MAX: unbounded), `separator` between items."""
    has_max = max_items != INT_MAX
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return item + "?"
    if not separator:
        if min_items == 1 and not has_max:
            return item + "+"
        if min_items == 0 and not has_max:
            return item + "*"
        return f"{item}{{{min_items},{max_items if has_max else ''}}}"
    rest = repetition(
        f"({separator} {item})",
        0 if min_items == 0 else min_items - 1,
        max_items - 1 if has_max else max_items,
    )
    result = f"{item} {rest}"
    return f"({result})?" if min_items == 0 else result


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _digit_range(out: list[str], lo: str, hi: str) -> None:
    out.append(f"[{lo}]" if lo == hi else f"[{lo}-{hi}]")


def _more_digits(out: list[str], min_digits: int, max_digits: int) -> None:
    out.append("[0-9]")
    if min_digits == max_digits == 1:
        return
    out.append("{" + str(min_digits))
    if max_digits != min_digits:
        out.append("," + (str(max_digits) if max_digits != INT_MAX else ""))
    out.append("}")


def _uniform_range(out: list[str], lo: str, hi: str) -> None:
    """Numbers of the same digit count from `lo` to `hi` (both as digit strings)."""
    i = 0
    while i < len(lo) and i < len(hi) and lo[i] == hi[i]:
        i += 1
    if i > 0:
        out.append(f'"{lo[:i]}"')
    if i >= len(lo) or i >= len(hi):
        return
    if i > 0:
        out.append(" ")
    sub_len = len(lo) - i - 1
    if sub_len <= 0:
        out.append(f"[{lo[i]}-{hi[i]}]")
        return
    lo_sub, hi_sub = lo[i + 1 :], hi[i + 1 :]
    zeros, nines = "0" * sub_len, "9" * sub_len
    to_reached = False
    out.append("(")
    if lo_sub == zeros:
        _digit_range(out, lo[i], chr(ord(hi[i]) - 1))
        out.append(" ")
        _more_digits(out, sub_len, sub_len)
    else:
        out.append(f"[{lo[i]}] (")
        _uniform_range(out, lo_sub, nines)
        out.append(")")
        if ord(lo[i]) < ord(hi[i]) - 1:
            out.append(" | ")
            if hi_sub == nines:
                _digit_range(out, chr(ord(lo[i]) + 1), hi[i])
                to_reached = True
            else:
                _digit_range(out, chr(ord(lo[i]) + 1), chr(ord(hi[i]) - 1))
            out.append(" ")
            _more_digits(out, sub_len, sub_len)
    if not to_reached:
        out.append(" | ")
        _digit_range(out, hi[i], hi[i])
        out.append(" ")
        _uniform_range(out, zeros, hi_sub)
    out.append(")")


def min_max_int(lo: int, hi: int, decimals: int = 16, top: bool = True) -> str:
    """Integers in [lo, hi] (INT64_MIN / INT64_MAX: unbounded), llama.cpp's `build_min_max_int`."""
    out: list[str] = []
    _min_max(out, lo, hi, decimals, top)
    return "".join(out)


def _min_max(out: list[str], lo: int, hi: int, decimals: int, top: bool) -> None:
    has_min, has_max = lo != INT64_MIN, hi != INT64_MAX
    if has_min and has_max:
        _bounded(out, lo, hi, decimals)
        return
    less = max(decimals - 1, 1)
    if has_min:
        _from_min(out, lo, decimals, less, top)
        return
    if has_max:
        if hi >= 0:
            if top:
                out.append('"-" [1-9] ')
                _more_digits(out, 0, less)
                out.append(" | ")
            _min_max(out, 0, hi, decimals, True)
        else:
            out.append('"-" (')
            _min_max(out, -hi, INT64_MAX, decimals, False)
            out.append(")")
        return
    raise SchemaError("an integer range needs a minimum or a maximum")


def _bounded(out: list[str], lo: int, hi: int, decimals: int) -> None:
    if lo < 0 and hi < 0:
        out.append('"-" (')
        _min_max(out, -hi, -lo, decimals, True)
        out.append(")")
        return
    if lo < 0:
        out.append('"-" (')
        _min_max(out, 0, -lo, decimals, True)
        out.append(") | ")
        lo = 0
    lo_s, hi_s = str(lo), str(hi)
    for digits in range(len(lo_s), len(hi_s)):
        _uniform_range(out, lo_s, "9" * digits)
        lo_s = "1" + "0" * digits
        out.append(" | ")
    _uniform_range(out, lo_s, hi_s)


def _from_min(out: list[str], lo: int, decimals: int, less: int, top: bool) -> None:
    if lo < 0:
        out.append('"-" (')
        _min_max(out, INT64_MIN, -lo, decimals, False)
        out.append(") | [0] | [1-9] ")
        _more_digits(out, 0, decimals - 1)
    elif lo == 0:
        if top:
            out.append("[0] | [1-9] ")
            _more_digits(out, 0, less)
        else:
            _more_digits(out, 1, decimals)
    elif lo <= 9:
        c = str(lo)
        start = "1" if top else "0"
        if c > start:
            _digit_range(out, start, chr(ord(c) - 1))
            out.append(" ")
            _more_digits(out, 1, less)
            out.append(" | ")
        _digit_range(out, c, "9")
        out.append(" ")
        _more_digits(out, 0, less)
    else:
        s = str(lo)
        c = s[0]
        if c > "1":
            _digit_range(out, "1" if top else "0", chr(ord(c) - 1))
            out.append(" ")
            _more_digits(out, len(s), less)
            out.append(" | ")
        _digit_range(out, c, c)
        out.append(" (")
        _min_max(out, int(s[1:]), INT64_MAX, less, False)
        out.append(")")
        if c < "9":
            out.append(" | ")
            _digit_range(out, chr(ord(c) + 1), "9")
            out.append(" ")
            _more_digits(out, len(s) - 1, less)


def _class_char(ch: str) -> str:
    """One character inside a GBNF character class (llama.cpp writes them raw, which breaks on `]`)."""
    if ch in '"\\]-^[' or ord(ch) < 0x20:
        return f"\\x{ord(ch):02X}"
    return ch


def not_strings(strings: list[str], char_rule: str) -> str:
    """A JSON string that is none of `strings` (a trie walk, as llama.cpp's `_not_strings`)."""
    trie: dict[str, Any] = {}
    for s in strings:
        node = trie
        for ch in s:
            node = node.setdefault(ch, {})
        node[""] = True  # end of a word
    out: list[str] = ['["] ( ']

    def visit(node: dict[str, Any]) -> None:
        children = sorted(k for k in node if k)
        for n, ch in enumerate(children):
            if n:
                out.append(" | ")
            out.append(f"[{_class_char(ch)}]")
            child = node[ch]
            if any(k for k in child):
                out.append(" (")
                visit(child)
                out.append(")")
            else:
                out.append(f" {char_rule}+")
        if children:
            out.append(f' | [^"{"".join(map(_class_char, children))}] {char_rule}*')

    visit(trie)
    out.append(" )")
    if "" not in trie:
        out.append("?")
    out.append(' ["]')
    return "".join(out)
