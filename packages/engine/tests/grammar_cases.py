"""llama.cpp's grammar tests read as data: the cases of tests/test-grammar-parser.cpp and
tests/test-grammar-integration.cpp in the llama.cpp source tree ($LLAMA_CPP_SRC).

Only the C++ literals are read (raw strings, string literals with their escapes, ``token(N)`` pieces,
element lists); nothing of the C++ is run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_SRC = Path(
    os.environ.get("LLAMA_CPP_SRC", str(Path.home() / ".cache/llama-py/llama-cpp-src-11434.0.0"))
)
TOKEN_MARK = "\uffff"  # stands for token(N) in a test string: TOKEN_MARK + "N" + TOKEN_MARK


def source(rel: str) -> str:
    path = LLAMA_CPP_SRC / rel
    if not path.exists():
        raise RuntimeError(f"llama.cpp's source tree is needed at {LLAMA_CPP_SRC} (set LLAMA_CPP_SRC)")
    return path.read_text(encoding="utf-8")


class _Reader:
    """A cursor over C++ text that reads the few literal forms the tests use."""

    def __init__(self, text: str, pos: int = 0) -> None:
        self.t = text
        self.i = pos

    def skip(self) -> None:
        while True:
            m = re.compile(r"\s+|//[^\n]*|/\*.*?\*/", re.S).match(self.t, self.i)
            if not m or m.end() == self.i:
                return
            self.i = m.end()

    def peek(self, s: str) -> bool:
        self.skip()
        return self.t.startswith(s, self.i)

    def expect(self, s: str) -> None:
        if not self.peek(s):
            raise ValueError(f"expected {s!r} at {self.t[self.i : self.i + 40]!r}")
        self.i += len(s)

    def raw(self) -> str:
        self.expect('R"""(')
        end = self.t.index(')"""', self.i)
        out = self.t[self.i : end]
        self.i = end + 4
        return out

    def literal(self) -> str:
        self.expect('"')
        out: list[str] = []
        buf = bytearray()
        t = self.t
        while t[self.i] != '"':
            c = t[self.i]
            if c == "\\":
                e = t[self.i + 1]
                if e == "x":
                    m = re.compile(r"[0-9a-fA-F]+").match(t, self.i + 2)
                    assert m
                    buf.append(int(m.group(), 16))
                    self.i = m.end()
                    continue
                buf += {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", '"': b'"', "'": b"'", "0": b"\0"}[e]
                self.i += 2
                continue
            buf += c.encode("utf-8")
            self.i += 1
        self.i += 1
        out.append(buf.decode("utf-8", "surrogateescape"))
        return "".join(out)

    def expr(self) -> str:
        """String literal / raw string / token(N), joined by `+` or adjacency."""
        parts: list[str] = []
        while True:
            if self.peek('R"""('):
                parts.append(self.raw())
            elif self.peek('"'):
                parts.append(self.literal())
            elif self.peek("token("):
                self.expect("token(")
                m = re.compile(r"\d+").match(self.t, self.i)
                assert m
                self.i = m.end()
                self.expect(")")
                parts.append(f"{TOKEN_MARK}{m.group()}{TOKEN_MARK}")
            else:
                return "".join(parts)
            if self.peek("+"):
                self.expect("+")

    def string_list(self) -> list[str]:
        self.expect("{")
        out = []
        while not self.peek("}"):
            out.append(self.expr())
            if self.peek(","):
                self.expect(",")
        self.expect("}")
        return out


@dataclass
class GrammarCase:
    name: str
    grammar: str
    passing: list[str]
    failing: list[str]


def integration_cases() -> list[GrammarCase]:
    """Every ``test_grammar(name, grammar, passing, failing)`` of test-grammar-integration.cpp."""
    text = source("tests/test-grammar-integration.cpp")
    cases = []
    for m in re.finditer(r"\n\s*test_grammar\(", text):
        r = _Reader(text, m.end())
        name = r.literal()
        r.expect(",")
        grammar = r.expr()
        r.expect(",")
        passing = r.string_list()
        failing: list[str] = []
        if r.peek(","):
            r.expect(",")
            failing = r.string_list()
        cases.append(GrammarCase(name, grammar, passing, failing))
    return cases


@dataclass
class ParserCase:
    grammar: str
    symbols: dict[str, int]
    elements: list[tuple[str, int]]


_CHAR_ESC = {"n": 10, "t": 9, "r": 13, "\\": 92, "'": 39, '"': 34, "0": 0}


def _element_value(v: str) -> int:
    v = re.sub(r"/\*.*?\*/", "", v).strip()
    if v.startswith("'"):
        body = v[1:-1]
        if body.startswith("\\"):
            return _CHAR_ESC[body[1]]
        return ord(body)
    return int(v, 0)


def parser_cases() -> tuple[list[ParserCase], list[str]]:
    """(``verify_parsing`` cases, ``verify_failure`` grammars) of test-grammar-parser.cpp."""
    text = source("tests/test-grammar-parser.cpp")
    ok = []
    for m in re.finditer(r"\n\s*verify_parsing\(", text):
        r = _Reader(text, m.end())
        grammar = r.expr()
        r.expect(",")
        end = text.index("});", r.i)
        body = text[r.i : end]
        sym_part, _, elem_part = body.partition("}, {")
        symbols = {a: int(b) for a, b in re.findall(r'\{"([^"]+)",\s*(\d+)\}', sym_part)}
        elements = [
            (kind, _element_value(value))
            for kind, value in re.findall(
                r"\{LLAMA_GRETYPE_(\w+),\s*((?:/\*.*?\*/\s*)?(?:'(?:\\.|[^'])'|\w+))\}", elem_part
            )
        ]
        ok.append(ParserCase(grammar, symbols, elements))
    bad = []
    for m in re.finditer(r"\n\s*verify_failure\(", text):
        bad.append(_Reader(text, m.end()).expr())
    return ok, bad
