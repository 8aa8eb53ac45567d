"""A grammar's pushdown stacks, as llama.cpp's ``llama_grammar`` moves them, with every step memoized.

A stack is a tuple of element positions (top last) into the grammar's rules laid end to end; a state
is the set of stacks llama.cpp would hold, interned to a small int. ``step(state, cp)`` is
``llama_grammar_accept`` for one code point (each stack matched and advanced, duplicates dropped),
computed once per (state, code point) and then looked up. State 0 is the dead state (no stack).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from .elements import ElementType, Grammar, GrammarError
from .utf8 import Partial, partial_range

__all__ = ["DEAD", "MAX_DEPTH", "MAX_STACKS", "MAX_STATES", "CompiledGrammar"]

DEAD = 0
MAX_STACKS = 4096  # parallel stacks in one state (an ambiguous grammar's blow-up ends with an error)
MAX_DEPTH = 1024  # elements on one stack (nesting the text opens and has not closed)
MAX_STATES = 200_000  # distinct states a compiled grammar keeps before it stops taking new requests

_END, _ALT, _REF = int(ElementType.END), int(ElementType.ALT), int(ElementType.RULE_REF)
_CHAR, _NOT, _UPPER = int(ElementType.CHAR), int(ElementType.CHAR_NOT), int(ElementType.CHAR_RNG_UPPER)
_CALT, _ANY = int(ElementType.CHAR_ALT), int(ElementType.CHAR_ANY)
_TOK, _TOK_NOT = int(ElementType.TOKEN), int(ElementType.TOKEN_NOT)

Stack = tuple[int, ...]


class _Class:
    """One char class (a literal char, ``[...]``, ``[^...]`` or ``.``) at a position."""

    __slots__ = ("after", "any", "positive", "ranges")

    def __init__(self, positive: bool, ranges: tuple[tuple[int, int], ...], any_: bool, after: int) -> None:
        self.positive = positive
        self.ranges = ranges
        self.any = any_
        self.after = after  # the position after the class (llama_grammar_match_char's second)

    def match(self, cp: int) -> bool:
        if self.any:
            return True
        found = False
        for lo, hi in self.ranges:
            if lo <= cp <= hi:
                found = True
                break
        return found == self.positive

    def match_partial(self, partial: Partial) -> bool:
        rng = partial_range(partial)
        if rng is None:
            return False
        if self.any:
            return True
        low, high = rng
        for lo, hi in self.ranges:
            if lo <= high and low <= hi:
                return self.positive
        return not self.positive


class CompiledGrammar:
    """The rules of a Grammar laid out flat, its interned states and memoized steps (not thread-safe:
    one engine thread uses it)."""

    def __init__(self, grammar: Grammar) -> None:
        if grammar.token_names:
            raise GrammarError(
                f"parse: error parsing grammar: no vocab to parse token at {grammar.token_names[0]}"
            )
        self.grammar = grammar
        self.types: list[int] = []
        self.values: list[int] = []
        self.rule_start: list[int] = []
        for rule in grammar.rules:
            self.rule_start.append(len(self.types))
            for t, v in rule:
                self.types.append(int(t))
                self.values.append(int(v))
        self.classes: dict[int, _Class] = {}
        for pos, t in enumerate(self.types):
            if t in (_CHAR, _NOT, _ANY):  # every such element starts a class (CHAR_ALT, RNG_UPPER go on one)
                self.classes[pos] = self._make_class(pos)
        self.has_tokens = grammar.has_tokens
        self._advanced: dict[Stack, tuple[Stack, ...]] = {}
        self.states: list[tuple[Stack, ...]] = [()]
        self._ids: dict[frozenset[Stack], int] = {frozenset(): DEAD}
        self.steps: list[dict[int, int]] = [{}]
        self.can_end: list[bool] = [False]
        self.token_tops: list[tuple[Stack, ...]] = [()]  # stacks whose top is a token element
        # GrammarVocab.allowed's masks, by vocabulary, then by state
        self.masks: weakref.WeakKeyDictionary[object, OrderedDict[int, np.ndarray]] = (
            weakref.WeakKeyDictionary()
        )
        self.tables: weakref.WeakKeyDictionary[object, Any] = weakref.WeakKeyDictionary()  # walk.StepTable
        self._lock = threading.Lock()  # engines of other models in this process may share the grammar
        self.initial = self._initial()

    # -- layout -----------------------------------------------------------------------------------------

    def _make_class(self, pos: int) -> _Class:
        types, values = self.types, self.values
        t0 = types[pos]
        ranges: list[tuple[int, int]] = []
        any_ = False
        p = pos
        while True:
            if types[p + 1] == _UPPER:
                ranges.append((values[p], values[p + 1]))
                p += 2
            elif types[p] == _ANY:
                any_ = True
                p += 1
            else:
                ranges.append((values[p], values[p]))
                p += 1
            if types[p] != _CALT:
                break
        return _Class(t0 != _NOT, tuple(ranges), any_, p)

    def is_end(self, pos: int) -> bool:
        t = self.types[pos]
        return t in (_END, _ALT)

    def _alternates(self, rule_id: int) -> list[int]:
        """Start positions of a rule's alternates."""
        out = []
        p = self.rule_start[rule_id]
        while True:
            out.append(p)
            while not self.is_end(p):
                p += 1
            if self.types[p] != _ALT:
                return out
            p += 1

    # -- stacks -----------------------------------------------------------------------------------------

    def advance(self, stack: Stack) -> tuple[Stack, ...]:
        """llama_grammar_advance_stack: the stacks, each topped by a terminal (or empty), that a stack
        expands to."""
        done = self._advanced.get(stack)
        if done is not None:
            return done
        out: dict[Stack, None] = {}
        todo = [stack]
        seen: set[Stack] = set()
        types, values = self.types, self.values
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if not cur:
                out[cur] = None
                continue
            pos = cur[-1]
            t = types[pos]
            if t == _REF:
                if len(cur) > MAX_DEPTH:  # rules that expand without consuming text grow the stack
                    raise GrammarError(f"the grammar's stacks grow deeper than {MAX_DEPTH} elements")
                base = cur[:-1] if self.is_end(pos + 1) else (*cur[:-1], pos + 1)
                for sub in self._alternates(values[pos]):
                    todo.append(base if self.is_end(sub) else (*base, sub))
            else:
                out[cur] = None
            if len(out) > MAX_STACKS or len(seen) > 2 * MAX_STACKS:
                raise GrammarError(f"the grammar is too ambiguous: more than {MAX_STACKS} parallel stacks")
        result = tuple(out)
        self._advanced[stack] = result
        return result

    def intern(self, stacks: dict[Stack, None] | tuple[Stack, ...] | list[Stack]) -> int:
        """The id of a set of stacks (new ids for new sets)."""
        key = frozenset(stacks)
        sid = self._ids.get(key)
        if sid is not None:
            return sid
        with self._lock:
            return self._intern(key, stacks)

    def _intern(
        self, key: frozenset[Stack], stacks: dict[Stack, None] | tuple[Stack, ...] | list[Stack]
    ) -> int:
        sid = self._ids.get(key)
        if sid is not None:
            return sid
        if len(key) > MAX_STACKS:
            raise GrammarError(f"the grammar is too ambiguous: more than {MAX_STACKS} parallel stacks")
        sid = len(self.states)
        ordered = tuple(stacks)
        self.steps.append({})
        self.can_end.append(any(not s for s in ordered))
        self.token_tops.append(tuple(s for s in ordered if s and self.types[s[-1]] in (_TOK, _TOK_NOT)))
        self.states.append(ordered)
        self._ids[key] = sid  # last: a reader that finds the id finds its tables
        return sid

    @property
    def full(self) -> bool:
        """Whether this grammar has interned so many states that new requests should start afresh."""
        return len(self.states) > MAX_STATES

    def _initial(self) -> int:
        out: dict[Stack, None] = {}
        for alt in self._alternates(self.grammar.root):
            for s in self.advance(() if self.is_end(alt) else (alt,)):
                out[s] = None
        return self.intern(out)

    # -- steps ------------------------------------------------------------------------------------------

    def step(self, sid: int, cp: int) -> int:
        """The state after code point ``cp`` (DEAD if no stack accepts it)."""
        steps = self.steps[sid]
        nxt = steps.get(cp)
        if nxt is None:
            nxt = steps[cp] = self._step(sid, cp)
        return nxt

    def _step(self, sid: int, cp: int) -> int:
        out: dict[Stack, None] = {}
        classes = self.classes
        for stack in self.states[sid]:
            if not stack:
                continue
            cls = classes.get(stack[-1])
            if cls is None or not cls.match(cp):  # token elements never match a char
                continue
            rest = stack[:-1] if self.is_end(cls.after) else (*stack[:-1], cls.after)
            for s in self.advance(rest):
                out[s] = None
        return self.intern(out) if out else DEAD

    def walk(self, sid: int, cps: list[int]) -> int:
        """The state after each code point in turn."""
        for cp in cps:
            if sid == DEAD:
                return DEAD
            sid = self.step(sid, cp)
        return sid

    def char_part(self, sid: int) -> int:
        """The state keeping only the stacks topped by a char class."""
        stacks = [s for s in self.states[sid] if s and s[-1] in self.classes]
        return self.intern(stacks) if len(stacks) != len(self.states[sid]) else sid

    def match_partial(self, sid: int, partial: Partial) -> bool:
        """Whether some stack's char class could accept the character a partial sequence completes to."""
        classes = self.classes
        return any(s and s[-1] in classes and classes[s[-1]].match_partial(partial) for s in self.states[sid])

    def token_matches(self, stack: Stack, token: int) -> bool:
        """llama_grammar_match_token for a stack topped by a token element."""
        pos = stack[-1]
        v = self.values[pos]
        return v == token if self.types[pos] == _TOK else v != token

    def after_token(self, sid: int, token: int) -> dict[Stack, None]:
        """The stacks that follow ``token`` matched by token elements on top of the stacks of ``sid``."""
        out: dict[Stack, None] = {}
        for stack in self.token_tops[sid]:
            if self.token_matches(stack, token):
                pos = stack[-1]
                rest = stack[:-1] if self.is_end(pos + 1) else (*stack[:-1], pos + 1)
                for s in self.advance(rest):
                    out[s] = None
        return out
