"""A parsed GBNF grammar: llama.cpp's ``llama_grammar_element`` rules, and the error every check raises.

Rules are kept exactly as llama.cpp's parser builds them (same symbol ids, same element order), so a
grammar's structure can be compared with llama.cpp's and the matcher follows the same stacks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "Element",
    "ElementType",
    "Grammar",
    "GrammarError",
    "GrammarStopError",
]


class GrammarError(ValueError):
    """A grammar that cannot be used; the message reads like llama.cpp's (``parse: error parsing
    grammar: ...``). ``offset``/``line``/``column`` say where, when the error is tied to a place."""

    def __init__(self, message: str, offset: int = -1, line: int = 0, column: int = 0) -> None:
        super().__init__(message)
        self.offset = offset
        self.line = line
        self.column = column


class GrammarStopError(RuntimeError):
    """The grammar allows no token that the sampler may choose. ``complete``: the text so far is a
    whole sentence of the grammar (the generation can end there, as at an end-of-generation token)."""

    def __init__(self, complete: bool) -> None:
        what = "the grammar is complete" if complete else "the grammar allows no token that can be sampled"
        super().__init__(what)
        self.complete = complete


class ElementType(enum.IntEnum):
    """llama_gretype."""

    END = 0  # end of a rule definition
    ALT = 1  # start of an alternate definition
    RULE_REF = 2  # value: rule id
    CHAR = 3  # value: code point
    CHAR_NOT = 4  # inverse char class ([^a], [^a-b])
    CHAR_RNG_UPPER = 5  # makes the preceding CHAR/CHAR_ALT an inclusive range
    CHAR_ALT = 6  # another char of the same class
    CHAR_ANY = 7  # "."
    TOKEN = 8  # value: token id (<[id]> or <name>)
    TOKEN_NOT = 9  # !<[id]>


Element = tuple[int, int]  # (ElementType, value)


@dataclass(frozen=True, eq=False)
class Grammar:
    """Rules indexed by symbol id, each ending with END; ``symbol_ids`` maps names (also the generated
    ``name_N`` ones) to ids, as llama.cpp's ``llama_grammar_parser``.

    ``token_names``: ``<name>`` references not yet resolved to a vocabulary (their TOKEN/TOKEN_NOT
    elements carry ``-1 - index``); ``bind_tokens`` resolves them against a tokenizer.
    """

    rules: tuple[tuple[Element, ...], ...]
    symbol_ids: dict[str, int]
    text: str = ""
    token_names: tuple[str, ...] = ()
    root_name: str = "root"
    _names: dict[int, str] = field(default_factory=dict, repr=False)

    @property
    def root(self) -> int:
        """The start rule's id."""
        return self.symbol_ids[self.root_name]

    def name(self, rule_id: int) -> str:
        """The symbol name of a rule id."""
        if not self._names:
            self._names.update({v: k for k, v in self.symbol_ids.items()})
        return self._names.get(rule_id, f"#{rule_id}")

    @property
    def n_elements(self) -> int:
        """Elements over all rules (the grammar's size)."""
        return sum(len(r) for r in self.rules)

    @property
    def has_tokens(self) -> bool:
        """Whether any rule matches token ids (``<[id]>``, ``!<...>``) rather than text only."""
        return any(t in (ElementType.TOKEN, ElementType.TOKEN_NOT) for r in self.rules for t, _ in r)
