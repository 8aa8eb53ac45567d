"""Lazy grammars: the grammar waits, unconstrained, until a trigger appears in the generated text.

As llama.cpp (common/sampling.cpp, ``llama_grammar_accept_impl``): words become escaped patterns,
``pattern_full`` patterns are anchored to the whole text, token triggers fire on a token id. Text
generated while waiting is buffered; when a pattern matches, the tokens from the match on (from its
first non-empty capture group, else from the match start) are replayed into the grammar.
"""

from __future__ import annotations

import enum
import re

import msgspec

__all__ = ["GrammarTrigger", "TriggerPatterns", "TriggerType", "trigger_patterns"]


class TriggerType(enum.IntEnum):
    """common_grammar_trigger_type (the values llama-server's JSON uses)."""

    TOKEN = 0
    WORD = 1
    PATTERN = 2
    PATTERN_FULL = 3


class GrammarTrigger(msgspec.Struct, frozen=True, kw_only=True):
    """One trigger of a lazy grammar: ``value`` is the word or the pattern; ``token`` the id of a TOKEN
    trigger."""

    type: TriggerType
    value: str = ""
    token: int = -1


def _anchored(pattern: str) -> str:
    if not pattern:
        return "^$"
    return ("" if pattern[0] == "^" else "^") + pattern + ("" if pattern[-1] == "$" else "$")


def trigger_patterns(triggers: tuple[GrammarTrigger, ...]) -> tuple[list[str], list[int]]:
    """(patterns, token ids) as common_sampler_init builds them from the triggers."""
    patterns: list[str] = []
    tokens: list[int] = []
    for t in triggers:
        if t.type == TriggerType.WORD:
            patterns.append(re.escape(t.value))
        elif t.type == TriggerType.PATTERN:
            patterns.append(t.value)
        elif t.type == TriggerType.PATTERN_FULL:
            patterns.append(_anchored(t.value))
        else:
            tokens.append(t.token)
    return patterns, tokens


class TriggerPatterns:
    """Compiled trigger patterns: ``find(text)`` is llama_grammar_trigger_pattern::find over them all."""

    __slots__ = ("_compiled",)

    def __init__(self, patterns: list[str]) -> None:
        compiled = []
        for p in patterns:
            try:
                compiled.append((p, re.compile(p, re.DOTALL)))
            except re.error as e:
                raise ValueError(f"grammar_triggers: invalid pattern {p!r}: {e}") from None
        self._compiled = compiled

    def find(self, text: str) -> int:
        """Where the constrained text starts (in characters of ``text``), or -1."""
        for p, rx in self._compiled:
            m = None
            if p and p[0] == "^" and p[-1] == "$":
                m = rx.fullmatch(text)
            if m is None:
                m = rx.search(text)
            if m is not None:
                for i in range(1, (rx.groups or 0) + 1):
                    if m.start(i) >= 0 and m.end(i) > m.start(i):
                        return m.start(i)
                return m.start(0)
        return -1
