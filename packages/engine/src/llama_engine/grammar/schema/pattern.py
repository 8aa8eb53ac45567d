"""A JSON schema `pattern` (a regular expression over the decoded string) as a grammar over the JSON
text of that string, following llama.cpp's `_visit_pattern` where it is sound.

Where llama.cpp writes text that is not valid JSON, this writes the JSON form: a `"`, a backslash or a
control character the pattern allows is produced escaped (`\\"`, `\\\\`, `\\n`, ...), `.` and negated
classes never produce a raw `"`, backslash or control character, and a pattern without `^`/`$` is
matched anywhere (any JSON characters around it) where llama.cpp gives up and accepts any string.
Shorthands (`\\d \\w \\s` and their negations) become ASCII classes, a subset of what they match. What
has no grammar equivalent (lookaround, backreferences, word boundaries, possessive quantifiers) raises
`SchemaError` instead of llama.cpp's silent fallback to any string.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .rules import INT_MAX, SchemaError, repetition

__all__ = ["MAX_PATTERN_DEPTH", "MAX_PATTERN_REPEAT", "pattern_rule"]

MAX_PATTERN_DEPTH = 100
MAX_PATTERN_REPEAT = 2000  # the grammar parser's bound on repetition counts (llama.cpp's)

_NON_LITERAL = frozenset("|.()[]{}*+?^$")
_META_ESCAPES = frozenset("^$.[]()|{}*+?")
_SHORT_ESCAPES = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B}
_HEX_LEN = {"x": 2, "u": 4, "U": 8}
_DIGITS = re.compile(r"[0-9]+")
_JSON_SHORT = {0x08: "\\\\b", 0x09: "\\\\t", 0x0A: "\\\\n", 0x0C: "\\\\f", 0x0D: "\\\\r"}
# what a JSON string may hold unescaped is everything but these
_UNSAFE_RANGES = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))
_EXCLUDE_UNSAFE = '"\\\\\\x00-\\x1F'
_EXCLUDE_NON_ASCII = "\\x7F-\\U0010FFFF"
_CLASS_SHORTHANDS = {
    "d": ((0x30, 0x39),),
    "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    "s": ((0x20, 0x20),),
}
_SHORTHAND_RULES = {
    "d": "[0-9]",
    "w": "[a-zA-Z0-9_]",
    "s": "[ ]",
    "D": f"[^0-9{_EXCLUDE_UNSAFE}{_EXCLUDE_NON_ASCII}]",
    "W": f"[^a-zA-Z0-9_{_EXCLUDE_UNSAFE}{_EXCLUDE_NON_ASCII}]",
    "S": f"[^ {_EXCLUDE_UNSAFE}{_EXCLUDE_NON_ASCII}]",
}
DOT_RULE = f"[^{_EXCLUDE_UNSAFE}]"

Item = tuple[str, bool]  # (grammar text, is literal text to be quoted)


def _json_char(cp: int, text: str) -> str:
    """Literal text producing the JSON encoding of code point `cp` (`text`: how the pattern wrote it,
    kept when it is already safe, as llama.cpp keeps its escapes)."""
    if cp == 0x22:
        return '\\\\\\"'
    if cp == 0x5C:
        return "\\\\\\\\"
    if cp < 0x20:
        return _JSON_SHORT.get(cp, f"\\\\u{cp:04x}")
    return text


def _class_cp(cp: int) -> str:
    if cp < 0x20 or chr(cp) in '"\\]-^[' or cp >= 0x7F:
        return f"\\x{cp:02X}" if cp < 0x100 else f"\\U{cp:08X}"
    return chr(cp)


def _ranges_text(ranges: list[tuple[int, int]]) -> str:
    return "".join(_class_cp(lo) if lo == hi else f"{_class_cp(lo)}-{_class_cp(hi)}" for lo, hi in ranges)


def _subtract_unsafe(ranges: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[int]]:
    """The safe part of `ranges` and the unsafe code points they held."""
    safe: list[tuple[int, int]] = []
    unsafe: set[int] = set()
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for ulo, uhi in _UNSAFE_RANGES:
            nxt = []
            for a, b in pieces:
                if b < ulo or a > uhi:
                    nxt.append((a, b))
                    continue
                unsafe.update(range(max(a, ulo), min(b, uhi) + 1))
                if a < ulo:
                    nxt.append((a, ulo - 1))
                if b > uhi:
                    nxt.append((uhi + 1, b))
            pieces = nxt
        safe.extend(pieces)
    return safe, sorted(unsafe)


class _Pattern:
    def __init__(self, pattern: str, name: str, add_rule: Callable[[str, str], str], whole: str) -> None:
        self.p = pattern
        self.whole = whole  # the pattern as the schema wrote it, for messages
        self.i = 0
        self.name = name
        self.add_rule = add_rule
        self.sub_rule_ids: dict[str, str] = {}
        self.depth = 0

    def fail(self, what: str) -> SchemaError:
        return SchemaError(f"pattern {self.whole!r} is not supported: {what}")

    def count(self, text: str, default: int) -> int:
        """A repetition count of ``{m,n}`` (``default`` when empty), held to MAX_PATTERN_REPEAT before it
        is converted (a count of thousands of digits would not even convert)."""
        digits = text.strip().lstrip("0") or ("0" if text.strip() else "")
        if not digits:
            return default
        if len(digits) > len(str(MAX_PATTERN_REPEAT)) or int(digits) > MAX_PATTERN_REPEAT:
            raise self.fail(f"repetition count over {MAX_PATTERN_REPEAT}")
        return int(digits)

    # -- escapes -------------------------------------------------------------------------------------

    def _escape(self) -> tuple[int | None, str, str]:
        """At a backslash: (code point or None, pattern text, shorthand letter or "")."""
        p, i = self.p, self.i
        if i + 1 >= len(p):
            raise SchemaError(f"invalid pattern {p!r}: trailing backslash")
        c = p[i + 1]
        if c in _HEX_LEN:
            n = _HEX_LEN[c]
            digits = p[i + 2 : i + 2 + n]
            if len(digits) != n or any(h not in "0123456789abcdefABCDEF" for h in digits):
                raise self.fail(f"escape \\{c} needs {n} hex digits")
            self.i += 2 + n
            cp = int(digits, 16)
            if cp > 0x10FFFF:
                raise self.fail("escape beyond U+10FFFF")
            return cp, p[i : i + 2 + n], ""
        self.i += 2
        if c in _SHORT_ESCAPES:
            return _SHORT_ESCAPES[c], p[i : i + 2], ""
        if c in "dwsDWS":
            return None, p[i : i + 2], c
        if c.isascii() and not c.isalnum():
            text = "\\-" if c == "-" else c
            return ord(c), text, ""
        raise self.fail(f"escape \\{c}")

    # -- character classes ---------------------------------------------------------------------------

    def _class(self) -> str:
        p = self.p
        self.i += 1  # '['
        negated = self.i < len(p) and p[self.i] == "^"
        if negated:
            self.i += 1
        start = self.i
        ranges: list[tuple[int, int]] = []
        verbatim_ok = True
        shorthand = False
        prev: int | None = None
        pending_dash = False
        while self.i < len(p) and p[self.i] != "]":
            if p[self.i] == "\\":
                if p[self.i + 1 : self.i + 2] not in tuple("xuUtrn[]-"):
                    verbatim_ok = False  # not an escape GBNF classes know: rebuilt from the ranges
                cp, _, letter = self._escape()
                if letter:
                    if letter.isupper():
                        raise self.fail(f"\\{letter} inside a character class")
                    ranges.extend(_CLASS_SHORTHANDS[letter])
                    shorthand, prev = True, None
                    continue
            else:
                cp = ord(p[self.i])
                self.i += 1
                if cp == 0x2D and prev is not None and self.i < len(p) and p[self.i] != "]":
                    pending_dash = True
                    continue
            assert cp is not None
            if pending_dash and prev is not None:
                if cp < prev:
                    raise SchemaError(f"invalid pattern {p!r}: bad character range")
                ranges[-1] = (prev, cp)
                pending_dash, prev = False, None
            else:
                ranges.append((cp, cp))
                prev = cp
        if self.i >= len(p):
            raise SchemaError(f"invalid pattern {p!r}: unterminated character class")
        content = p[start : self.i]
        self.i += 1  # ']'
        if not ranges:
            raise self.fail("an empty character class")
        if negated:
            body = content if verbatim_ok and not content.endswith("-") else _ranges_text(ranges)
            extra = _EXCLUDE_NON_ASCII if shorthand else ""
            return f"[^{body}{_EXCLUDE_UNSAFE}{extra}]"
        safe, unsafe = _subtract_unsafe(ranges)
        if not unsafe and verbatim_ok:
            return f"[{content}]"
        alts = [f"[{_ranges_text(safe)}]"] if safe else []
        alts += ['"' + _json_char(cp, chr(cp)) + '"' for cp in unsafe]
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    # -- sequences -----------------------------------------------------------------------------------

    def _join(self, seq: list[Item]) -> Item:
        out: list[str] = []
        literal = ""
        for text, is_literal in seq:
            if is_literal:
                literal += text
                continue
            if literal:
                out.append(f'"{literal}"')
                literal = ""
            out.append(text)
        if literal:
            out.append(f'"{literal}"')
        return " ".join(out), False

    @staticmethod
    def _to_rule(item: Item) -> str:
        return f'"{item[0]}"' if item[1] else item[0]

    def _group(self) -> str:
        p = self.p
        self.i += 1
        if p.startswith("?:", self.i):
            self.i += 2
        elif p.startswith("?P<", self.i) or (
            p.startswith("?<", self.i) and p[self.i + 2 : self.i + 3] not in "=!"
        ):
            end = p.find(">", self.i)
            if end < 0:
                raise SchemaError(f"invalid pattern {p!r}: unterminated group name")
            self.i = end + 1
        elif p.startswith("?", self.i):
            raise self.fail("lookaround, inline flags or other (? group syntax")
        self.depth += 1
        if self.depth > MAX_PATTERN_DEPTH:
            raise self.fail("nesting too deep")
        inner = self._to_rule(self.transform())
        return f"({inner})"

    def _curly(self, seq: list[Item]) -> None:
        p = self.p
        end = p.find("}", self.i)
        if end < 0:
            raise self.fail("unterminated curly brackets")
        nums = p[self.i + 1 : end].split(",")
        self.i = end + 1
        if (
            len(nums) not in (1, 2)
            or not all(_DIGITS.fullmatch(n.strip()) or n == "" for n in nums)
            or (nums[0] == "" and len(nums) == 1)
        ):
            raise self.fail("invalid repetition in curly brackets")
        lo = self.count(nums[0], 0)
        hi = lo if len(nums) == 1 else self.count(nums[1], INT_MAX)
        if hi < lo:
            raise SchemaError(f"invalid pattern {p!r}: min repeat greater than max repeat")
        if not seq:
            raise SchemaError(f"invalid pattern {p!r}: nothing to repeat")
        text, is_literal = seq[-1]
        if not is_literal:
            if text not in self.sub_rule_ids:
                self.sub_rule_ids[text] = ""
                self.sub_rule_ids[text] = self.add_rule(f"{self.name}-{len(self.sub_rule_ids)}", text)
            text = self.sub_rule_ids[text]
        seq[-1] = (repetition(f'"{text}"' if is_literal else text, lo, hi), False)

    def _quantifier(self, seq: list[Item], c: str) -> None:
        if not seq:
            raise SchemaError(f"invalid pattern {self.p!r}: nothing to repeat")
        self.i += 1
        seq[-1] = (self._to_rule(seq[-1]) + c, False)
        # a lazy quantifier (`+?`) matches the same strings; a possessive one (`++`) does not
        if self.i < len(self.p) and self.p[self.i] in "?+":
            if self.p[self.i] == "+":
                raise self.fail("possessive quantifiers")
            self.i += 1

    def transform(self) -> Item:
        p = self.p
        seq: list[Item] = []
        while self.i < len(p):
            c = p[self.i]
            if c == ".":
                seq.append((self.add_rule("dot", DOT_RULE), False))
                self.i += 1
            elif c == "(":
                seq.append((self._group(), False))
            elif c == ")":
                self.i += 1
                if self.depth == 0:
                    raise SchemaError(f"invalid pattern {p!r}: unbalanced parentheses")
                self.depth -= 1
                return self._join(seq)
            elif c in "^$":
                raise self.fail("an anchor inside the pattern")
            elif c == "[":
                seq.append((self._class(), False))
            elif c == "|":
                seq.append(("|", False))
                self.i += 1
            elif c in "*+?":
                self._quantifier(seq, c)
            elif c == "{":
                self._curly(seq)
            elif c == "\\":
                cp, text, letter = self._escape()
                if letter:
                    seq.append((_SHORTHAND_RULES[letter], False))
                else:
                    assert cp is not None
                    seq.append((_json_char(cp, text), True))
            elif c in "]}":
                raise self.fail(f"unsupported character: {c}")
            else:
                seq.append((_json_char(ord(c), c), True))
                self.i += 1
        return self._join(seq)


def _escaped_at(p: str, pos: int) -> bool:
    n = 0
    while pos - 1 - n >= 0 and p[pos - 1 - n] == "\\":
        n += 1
    return n % 2 == 1


def pattern_rule(
    pattern: str, name: str, add_rule: Callable[[str, str], str], char_rule: Callable[[], str]
) -> str:
    """The rule (added under `name`) for a JSON string matching `pattern` (`re.search` semantics)."""
    start = pattern.startswith("^")
    end = pattern.endswith("$") and len(pattern) > int(start) and not _escaped_at(pattern, len(pattern) - 1)
    body = pattern[int(start) : len(pattern) - int(end)]
    conv = _Pattern(body, name, add_rule, pattern)
    rule = _Pattern._to_rule(conv.transform())
    if conv.depth != 0:
        raise SchemaError(f"invalid pattern {pattern!r}: unbalanced parentheses")
    head = "" if start else f"{char_rule()}* "
    tail = "" if end else f" {char_rule()}*"
    return add_rule(name, f'"\\"" {head}({rule}){tail} "\\""')
