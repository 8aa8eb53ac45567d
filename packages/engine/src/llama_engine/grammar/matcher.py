"""One sequence's grammar state: llama.cpp's ``llama_grammar`` (stacks, partial UTF-8, lazy triggers).

``allows(token)`` and ``allowed()`` are ``llama_grammar_apply_impl`` on one token or on the whole
vocabulary; ``accept(token)`` is ``llama_grammar_accept_impl``. While a lazy grammar awaits its
trigger, it allows everything and buffers the generated text; when a trigger fires, the tokens from
the trigger on are replayed into the grammar.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from .compiled import DEAD, CompiledGrammar, Stack
from .elements import ElementType, GrammarError
from .parser import bind_tokens, parse_grammar
from .triggers import GrammarTrigger, TriggerPatterns, trigger_patterns
from .utf8 import NO_PARTIAL, Partial, decode_utf8
from .vocab import GrammarVocab

if TYPE_CHECKING:
    from ..sampling.params import SamplingParams

__all__ = ["GrammarMatcher", "check_grammar_request", "compile_grammar", "request_matcher"]

_CACHE_SIZE = 16
_compiled: OrderedDict[str, CompiledGrammar] = OrderedDict()


def compile_grammar(text: str, vocab_token_id: object = None) -> CompiledGrammar:
    """The compiled grammar for GBNF text, shared by the requests that use the same text (cached)."""
    g = _compiled.get(text)
    if g is not None and not g.full:
        _compiled.move_to_end(text)
        return g
    grammar = parse_grammar(text)
    if grammar.token_names:
        if not callable(vocab_token_id):
            raise GrammarError(
                f"parse: error parsing grammar: no vocab to parse token at {grammar.token_names[0]}"
            )
        grammar = bind_tokens(grammar, vocab_token_id)
    g = CompiledGrammar(grammar)
    if not grammar.token_names:
        _compiled[text] = g
        while len(_compiled) > _CACHE_SIZE:
            _compiled.popitem(last=False)
    return g


class GrammarMatcher:
    """The grammar state of one sequence (not thread-safe)."""

    def __init__(
        self,
        compiled: CompiledGrammar,
        vocab: GrammarVocab,
        *,
        lazy: bool = False,
        triggers: tuple[GrammarTrigger, ...] = (),
    ) -> None:
        self.compiled = compiled
        self.vocab = vocab
        self.lazy = lazy
        patterns, tokens = trigger_patterns(triggers)
        self._patterns = TriggerPatterns(patterns)
        self._trigger_tokens = frozenset(tokens)
        self.sid = compiled.initial
        self.partial: Partial = NO_PARTIAL
        self.awaiting = lazy
        self._buffer = b""
        self._positions: list[tuple[int, int, int]] = []

    def reset(self) -> None:
        """Back to the start (llama_sampler_grammar_reset)."""
        self.sid, self.partial = self.compiled.initial, NO_PARTIAL
        self.awaiting, self._buffer, self._positions = self.lazy, b"", []

    def clone(self) -> GrammarMatcher:
        """An independent copy of this state (the compiled grammar and vocabulary are shared)."""
        other = object.__new__(GrammarMatcher)
        other.__dict__.update(self.__dict__)
        other._positions = list(self._positions)
        return other

    @property
    def can_end(self) -> bool:
        """Whether the text so far is a complete sentence of the grammar (end-of-generation allowed);
        always true while a lazy grammar awaits its trigger."""
        return self.awaiting or self.compiled.can_end[self.sid]

    @property
    def stacks(self) -> tuple[Stack, ...]:
        """The pushdown stacks (element positions, top last), as llama_grammar_get_stacks."""
        return self.compiled.states[self.sid]

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next."""
        if self.awaiting:
            return True
        return self.vocab.allows(self.compiled, self.sid, self.partial, token)

    def allowed(self) -> np.ndarray | None:
        """Bool mask of the tokens that may come next (None: no constraint, a lazy grammar waiting)."""
        if self.awaiting:
            return None
        return self.vocab.allowed(self.compiled, self.sid, self.partial)

    def accept(self, token: int) -> None:
        """Advance past a generated token (raises GrammarError if the grammar cannot take it)."""
        piece = self.vocab.pieces[token]
        if self.awaiting:
            self._await(token, piece)
            return
        if self.vocab.eog[token]:
            if self.compiled.can_end[self.sid]:
                return
            raise GrammarError("end of generation before the grammar's text is complete")
        self.accept_piece(token, piece)

    def _await(self, token: int, piece: bytes) -> None:
        if token in self._trigger_tokens:
            self.awaiting, self._buffer = False, b""
            self.accept_piece(token, piece)
            return
        n = len(self._buffer)
        self._positions.append((token, n, n + len(piece)))
        self._buffer += piece
        start = self._patterns.find(self._buffer)
        if start < 0:
            return
        self.awaiting = False
        buffer, positions = self._buffer, self._positions
        self._buffer, self._positions = b"", []
        for tok, lo, hi in positions:
            if hi <= start:
                continue
            self.accept_piece(tok, buffer[max(lo, start) : hi])

    def accept_piece(self, token: int, piece: bytes) -> None:
        """llama_grammar_accept_token: token elements match the id, char classes the piece's text."""
        g = self.compiled
        cps, partial = decode_utf8(piece, self.partial)
        sid = g.walk(g.char_part(self.sid), cps) if cps else g.char_part(self.sid)
        if g.token_tops[self.sid]:
            stacks = g.after_token(self.sid, token)
            if stacks:
                if sid != DEAD:
                    stacks.update(dict.fromkeys(g.states[sid]))
                sid = g.intern(stacks)
        if sid == DEAD:
            text = piece.decode("utf-8", "replace")
            raise GrammarError(f"Unexpected empty grammar stack after accepting piece: {text} ({token})")
        self.sid, self.partial = sid, partial


def request_matcher(
    text: str,
    vocab: GrammarVocab,
    *,
    lazy: bool = False,
    triggers: tuple[GrammarTrigger, ...] = (),
    prefill: tuple[int, ...] = (),
    token_id: object = None,
) -> GrammarMatcher:
    """A request's grammar state, as common_sampler_init builds it: compiled (or cached) grammar text,
    lazy triggers, and the prefill tokens accepted first (not for a lazy grammar, as llama.cpp)."""
    m = GrammarMatcher(compile_grammar(text, token_id), vocab, lazy=lazy, triggers=triggers)
    if not lazy:
        for t in prefill:
            m.accept(t)
    return m


def check_grammar_request(params: SamplingParams, n_vocab: int, token_id: object = None) -> None:
    """Raise GrammarError (a ValueError) for a request's grammar that cannot be used: the text does not
    parse, or a token id of its triggers, preserved tokens or prefill is outside the vocabulary."""
    grammar = parse_grammar(params.grammar)
    if grammar.token_names:
        if not callable(token_id):
            raise GrammarError(
                f"parse: error parsing grammar: no vocab to parse token at {grammar.token_names[0]}"
            )
        grammar = bind_tokens(grammar, token_id)
    CompiledGrammar(grammar)  # its start state: a grammar that expands without bound fails here
    ids = [t.token for t in params.grammar_triggers if t.token >= 0]
    ids += list(params.preserved_tokens) + list(params.grammar_prefill)
    ids += [v for r in grammar.rules for k, v in r if k in (ElementType.TOKEN, ElementType.TOKEN_NOT)]
    for t in ids:
        if not 0 <= t < n_vocab:
            raise GrammarError(f"grammar: token id {t} is outside the vocabulary (n_vocab = {n_vocab})")
