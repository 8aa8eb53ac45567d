"""GBNF text to rules, as llama.cpp's ``llama_grammar_parser`` (src/llama-grammar.cpp) builds them.

The same symbol ids, the same rewrite of repetitions (``S{m,n}`` -> m copies of S and a chain of
optional rules), the same checks and messages. Beyond llama.cpp, hostile input is bounded: groups nest
at most ``MAX_NESTING`` deep and repetitions expand to at most ``MAX_ELEMENTS`` elements, each with a
clear error instead of a crash or a runaway allocation.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .elements import Element, ElementType, Grammar, GrammarError
from .validate import check_grammar

__all__ = ["MAX_ELEMENTS", "MAX_NESTING", "MAX_REPETITION_THRESHOLD", "parse_grammar"]

MAX_REPETITION_THRESHOLD = 2000  # llama.cpp's bound on repetition counts (and their product)
MAX_NESTING = 200  # nested groups; llama.cpp recurses without bound (and overflows its stack)
MAX_ELEMENTS = 500_000  # elements that repetitions may expand to
_EXCERPT = 48  # characters of the remaining input an error message quotes

_T = ElementType
_END: Element = (_T.END, 0)
_ALT: Element = (_T.ALT, 0)
_ESCAPES = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
_HEX = {"x": 2, "u": 4, "U": 8}
_NO_MAX = -1


_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_NAME = re.compile(r"[a-zA-Z0-9-]*")
_SPACE = re.compile(r"(?:[ \t]|#[^\r\n\0]*)*")
_SPACE_NL = re.compile(r"(?:[ \t\r\n]|#[^\r\n\0]*)*")
_REPEAT = {"*": (0, -1), "+": (1, -1), "?": (0, 1)}


def _is_word(c: str) -> bool:
    return c in _WORD


class _Fail(Exception):
    """A parse error at a position (converted to GrammarError with line and column)."""

    def __init__(self, message: str, pos: int = -1) -> None:
        super().__init__(message)
        self.pos = pos


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src + "\0"  # llama.cpp reads a C string: the NUL ends the input
        self.symbol_ids: dict[str, int] = {}
        self.rules: list[list[Element] | None] = []
        self.token_names: list[str] = []
        self.depth = 0
        self.expanded = 0

    # -- helpers (parse_space, parse_name, parse_int, parse_char) ---------------------------------------

    def at(self, pos: int) -> str:
        rest = self.src[pos:-1]
        return rest if len(rest) <= _EXCERPT else rest[:_EXCERPT] + "..."

    def fail(self, what: str, pos: int) -> _Fail:
        return _Fail(f"{what} at {self.at(pos)}", pos)

    def space(self, pos: int, newline_ok: bool) -> int:
        m = (_SPACE_NL if newline_ok else _SPACE).match(self.src, pos)
        return m.end() if m else pos

    def name_end(self, pos: int) -> int:
        m = _NAME.match(self.src, pos)
        end = m.end() if m else pos
        if end == pos:
            raise self.fail("expecting name", pos)
        return end

    def int_end(self, pos: int) -> int:
        end = pos
        while "0" <= self.src[end] <= "9":
            end += 1
        if end == pos:
            raise self.fail("expecting integer", pos)
        return end

    def char(self, pos: int) -> tuple[int, int]:
        s = self.src
        c = s[pos]
        if c == "\\":
            e = s[pos + 1]
            if e in _HEX:
                return self.hex(pos + 2, _HEX[e])
            if e in _ESCAPES:
                return _ESCAPES[e], pos + 2
            raise self.fail("unknown escape", pos)
        if c != "\0":
            return ord(c), pos + 1
        raise _Fail("unexpected end of input", pos)

    def hex(self, pos: int, size: int) -> tuple[int, int]:
        digits = self.src[pos : pos + size]
        n = 0
        for d in digits:
            if d not in "0123456789abcdefABCDEF":
                break
            n += 1
        if n != size:
            raise _Fail(f"expecting {size} hex chars at {self.at(pos)}", pos)
        return int(digits, 16), pos + size

    def token(self, pos: int) -> tuple[int, int]:
        """``<[id]>`` or ``<name>`` (resolved later against a vocabulary)."""
        s = self.src
        start = pos
        if s[pos] != "<":
            raise self.fail("expecting '<'", pos)
        pos += 1
        if s[pos] == "[":
            pos += 1
            end = self.int_end(pos)
            tid = int(s[pos:end])
            if tid > 0xFFFFFFFF:
                raise self.fail("parsed token id is too big", pos)
            if s[end] != "]":
                raise self.fail("expecting ']'", end)
            if s[end + 1] != ">":
                raise self.fail("expecting '>'", end + 1)
            return tid, end + 2
        while s[pos] != "\0" and s[pos] != ">":
            pos += 1
        if s[pos] != ">":
            raise self.fail("expecting '>'", pos)
        self.token_names.append(s[start : pos + 1])
        return -len(self.token_names), pos + 1

    # -- symbols and rules ------------------------------------------------------------------------------

    def symbol(self, name: str) -> int:
        return self.symbol_ids.setdefault(name, len(self.symbol_ids))

    def generate(self, base: str) -> int:
        next_id = len(self.symbol_ids)
        self.symbol_ids[f"{base}_{next_id}"] = next_id
        return next_id

    def add_rule(self, rule_id: int, rule: list[Element]) -> None:
        if len(self.rules) <= rule_id:
            self.rules.extend([None] * (rule_id + 1 - len(self.rules)))
        self.rules[rule_id] = rule

    # -- the grammar ------------------------------------------------------------------------------------

    def parse(self) -> None:
        pos = self.space(0, True)
        while self.src[pos] != "\0":
            pos = self.rule(pos)

    def rule(self, pos: int) -> int:
        end = self.name_end(pos)
        name = self.src[pos:end]
        p = self.space(end, False)
        rule_id = self.symbol(name)
        if self.src[p : p + 3] != "::=":
            raise self.fail("expecting ::=", p)
        p = self.alternates(self.space(p + 3, True), name, rule_id, False)
        c = self.src[p]
        if c == "\r":
            p += 2 if self.src[p + 1] == "\n" else 1
        elif c == "\n":
            p += 1
        elif c != "\0":
            raise self.fail("expecting newline or end", p)
        return self.space(p, True)

    def alternates(self, pos: int, name: str, rule_id: int, nested: bool) -> int:
        rule: list[Element] = []
        pos = self.sequence(pos, name, rule, nested)
        while self.src[pos] == "|":
            rule.append(_ALT)
            pos = self.sequence(self.space(pos + 1, True), name, rule, nested)
        rule.append(_END)
        self.add_rule(rule_id, rule)
        return pos

    def sequence(self, pos: int, name: str, rule: list[Element], nested: bool) -> int:
        s = self.src
        st = _Seq(len(rule))
        while True:
            c = s[pos]
            if c == '"':
                pos = self.literal(pos + 1, rule, st)
            elif c == "[":
                pos = self.char_class(pos + 1, rule, st)
            elif c == "<" or c == "!":
                kind = _T.TOKEN
                if c == "!":
                    kind, pos = _T.TOKEN_NOT, pos + 1
                tid, pos = self.token(pos)
                st.start(len(rule))
                rule.append((kind, tid))
            elif _is_word(c):
                end = self.name_end(pos)
                ref = self.symbol(s[pos:end])
                pos = end
                st.start(len(rule))
                rule.append((_T.RULE_REF, ref))
            elif c == "(":
                pos = self.group(pos, name, rule, st)
                if s[pos] != ")":
                    raise self.fail("expecting ')'", pos)
                pos += 1
            elif c == ".":
                st.start(len(rule))
                rule.append((_T.CHAR_ANY, 0))
                pos += 1
            elif c in "*+?":
                lo, hi = _REPEAT[c]
                pos = self.space(pos + 1, nested)
                self.repeat(pos, name, rule, st, lo, hi)
                continue
            elif c == "{":
                pos, lo, hi = self.braces(self.space(pos + 1, nested), nested)
                self.repeat(pos, name, rule, st, lo, hi)
                continue
            else:
                return pos
            pos = self.space(pos, nested)

    def literal(self, pos: int, rule: list[Element], st: _Seq) -> int:
        st.start(len(rule))
        s = self.src
        while s[pos] != '"':
            if s[pos] == "\0":
                raise _Fail("unexpected end of input", pos)
            cp, pos = self.char(pos)
            rule.append((_T.CHAR, cp))
        return pos + 1

    def char_class(self, pos: int, rule: list[Element], st: _Seq) -> int:
        s = self.src
        start_type = _T.CHAR
        if s[pos] == "^":
            pos += 1
            start_type = _T.CHAR_NOT
        st.start(len(rule))
        first = len(rule)
        while s[pos] != "]":
            if s[pos] == "\0":
                raise _Fail("unexpected end of input", pos)
            cp, pos = self.char(pos)
            rule.append((_T.CHAR_ALT if len(rule) > first else start_type, cp))
            if s[pos] == "-" and s[pos + 1] != "]":
                if s[pos + 1] == "\0":
                    raise _Fail("unexpected end of input", pos + 1)
                hi, pos = self.char(pos + 1)
                rule.append((_T.CHAR_RNG_UPPER, hi))
        return pos + 1

    def group(self, pos: int, name: str, rule: list[Element], st: _Seq) -> int:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.fail(f"groups nest deeper than {MAX_NESTING} levels", pos)
        n_before = len(self.symbol_ids)
        sub = self.generate(name)
        pos = self.alternates(self.space(pos + 1, True), name, sub, True)
        self.depth -= 1
        st.n_prev_rules = max(1, len(self.symbol_ids) - n_before)
        st.last = len(rule)
        rule.append((_T.RULE_REF, sub))
        return pos

    def braces(self, pos: int, nested: bool) -> tuple[int, int, int]:
        s = self.src
        if not "0" <= s[pos] <= "9":
            raise self.fail("expecting an int", pos)
        pos, lo = self.count(pos)
        pos = self.space(pos, nested)
        hi = _NO_MAX
        if s[pos] == "}":
            hi = lo
            pos = self.space(pos + 1, nested)
        elif s[pos] == ",":
            pos = self.space(pos + 1, nested)
            if "0" <= s[pos] <= "9":
                pos, hi = self.count(pos)
                pos = self.space(pos, nested)
            if s[pos] != "}":
                raise self.fail("expecting '}'", pos)
            pos = self.space(pos + 1, nested)
        else:
            raise self.fail("expecting ','", pos)
        return pos, lo, hi

    def count(self, pos: int) -> tuple[int, int]:
        """A repetition count at ``pos`` and the position after it. llama.cpp refuses a minimum above
        MAX_REPETITION_THRESHOLD but reads such a maximum as "no maximum" (``{0,2147483648}`` would quietly
        mean ``*``): every count is held to the bound here, checked before it is converted or expanded."""
        end = self.int_end(pos)
        digits = self.src[pos:end].lstrip("0") or "0"
        if len(digits) <= len(str(MAX_REPETITION_THRESHOLD)) and int(digits) <= MAX_REPETITION_THRESHOLD:
            return end, int(digits)
        got = digits if len(digits) <= 20 else f"a number of {len(digits)} digits"
        raise _Fail(
            "number of repetitions exceeds sane defaults, please reduce the number of repetitions "
            f"(a repetition count is at most {MAX_REPETITION_THRESHOLD}, got {got})",
            pos,
        )

    def repeat(self, pos: int, name: str, rule: list[Element], st: _Seq, lo: int, hi: int) -> None:
        """S{m,n} -> m copies of S, then n-m nested optional rules S'(x) ::= S S'(x-1) | (llama.cpp's
        rewrite; S{m,} ends with S' ::= S S' |)."""
        if st.last == len(rule):
            raise self.fail("expecting preceding item to */+/?/{", pos)
        no_max = hi == _NO_MAX
        prev = rule[st.last :]
        total = hi if (not no_max and hi > 0) else (lo if lo > 0 else 1)
        if st.n_prev_rules * total > MAX_REPETITION_THRESHOLD:
            raise _Fail(
                "number of rules that are going to be repeated multiplied by the new repetition exceeds "
                "sane defaults, please reduce the number of repetitions or rule complexity",
                pos,
            )
        if not no_max and hi < lo:
            raise self.fail(f"repetition maximum {hi} is below its minimum {lo}", pos)
        n_opt = 1 if no_max else hi - lo
        self.expanded += max(lo - 1, 0) * len(prev) + max(n_opt, 0) * (len(prev) + 3)
        if self.expanded > MAX_ELEMENTS:
            raise _Fail(f"repetitions expand the grammar beyond {MAX_ELEMENTS} elements", pos)
        if lo == 0:
            del rule[st.last :]
        else:
            for _ in range(1, lo):
                rule.extend(prev)
        last_rec = 0
        for i in range(n_opt):
            rec = self.generate(name)
            body = list(prev)
            if i > 0 or no_max:
                body.append((_T.RULE_REF, rec if no_max else last_rec))
            body += [_ALT, _END]
            self.add_rule(rec, body)
            last_rec = rec
        if n_opt > 0:
            rule.append((_T.RULE_REF, last_rec))
        st.n_prev_rules *= total


class _Seq:
    """parse_sequence's running state: where the last item starts and how many rules it spans."""

    __slots__ = ("last", "n_prev_rules")

    def __init__(self, last: int) -> None:
        self.last = last
        self.n_prev_rules = 1

    def start(self, at: int) -> None:
        self.last = at
        self.n_prev_rules = 1


def _where(src: str, pos: int) -> tuple[int, int]:
    line = src.count("\n", 0, pos) + 1
    return line, pos - (src.rfind("\n", 0, pos) + 1) + 1


def parse_grammar(
    text: str, root: str = "root", token_id: Callable[[str], int | None] | None = None
) -> Grammar:
    """Parse GBNF text into a checked Grammar, or raise GrammarError saying what and where.

    Checks as llama.cpp's ``llama_grammar_init_impl``: every referenced rule is defined, ``root``
    exists, no rule is left-recursive. ``token_id`` resolves ``<name>`` token references (the text
    must be exactly one token); without it they stay unresolved until ``bind_tokens``.
    """
    if text.startswith("%llguidance"):  # llama.cpp's Lark grammars, when built with llguidance
        raise GrammarError("failed to parse grammar: llguidance is not enabled")
    p = _Parser(text.split("\0", 1)[0])
    try:
        p.parse()
    except _Fail as e:
        line, col = _where(p.src, e.pos) if e.pos >= 0 else (0, 0)
        where = f" (line {line}, column {col})" if e.pos >= 0 else ""
        raise GrammarError(f"parse: error parsing grammar: {e}{where}", e.pos, line, col) from None
    except RecursionError:
        raise GrammarError("parse: error parsing grammar: the grammar nests too deeply") from None
    grammar = check_grammar(p.rules, p.symbol_ids, text, tuple(p.token_names), root)
    return bind_tokens(grammar, token_id) if token_id is not None and grammar.token_names else grammar


def bind_tokens(grammar: Grammar, token_id: Callable[[str], int | None]) -> Grammar:
    """The grammar with its ``<name>`` references resolved by ``token_id`` (text -> the one token id,
    or None when the text is not exactly one token: llama.cpp's ``invalid token '<name>'``)."""
    if not grammar.token_names:
        return grammar
    ids: list[int] = []
    for name in grammar.token_names:
        tid = token_id(name)
        if tid is None:
            raise GrammarError(f"parse: error parsing grammar: invalid token '{name}'")
        ids.append(tid)
    rules = tuple(
        tuple((t, ids[-1 - v]) if t in (_T.TOKEN, _T.TOKEN_NOT) and v < 0 else (t, v) for t, v in r)
        for r in grammar.rules
    )
    return Grammar(rules, grammar.symbol_ids, grammar.text, (), grammar.root_name)
