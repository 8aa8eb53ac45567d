"""The grammar matcher: llama.cpp's integration cases (strings that must match or not, read from
tests/test-grammar-integration.cpp), partial UTF-8, token elements, lazy triggers, and the trie
check of the whole vocabulary against the one-token check."""

from __future__ import annotations

import numpy as np
import pytest
from grammar_cases import LLAMA_CPP_SRC, TOKEN_MARK, integration_cases

from llama_engine.grammar import GrammarError, parse_grammar
from llama_engine.grammar.compiled import CompiledGrammar
from llama_engine.grammar.matcher import GrammarMatcher, compile_grammar
from llama_engine.grammar.triggers import GrammarTrigger, TriggerType
from llama_engine.grammar.utf8 import INVALID, NO_PARTIAL, decode_utf8
from llama_engine.grammar.vocab import GrammarVocab

CASES = integration_cases()
EOS = 300


def _byte_vocab(extra: list[bytes] = ()) -> GrammarVocab:
    """256 byte tokens (0 is an empty piece), then ``extra``, up to id 299; 300 is end-of-generation."""
    pieces = [bytes([i]) for i in range(256)] + list(extra)
    pieces += [b"<unused>"] * (EOS - len(pieces)) + [b"</s>"]
    return GrammarVocab(pieces, [EOS])


VOCAB = _byte_vocab()


def _pieces(text: str) -> list[tuple[int, bytes]]:
    """llama.cpp's parse_tokens: token(N) marks become <[N]> pieces with id N, every other code point a
    piece of its own with id 0."""
    out = []
    parts = text.split(TOKEN_MARK)
    for i, part in enumerate(parts):
        if i % 2:
            out.append((int(part), f"<[{part}]>".encode()))
        else:
            out += [(0, ch.encode("utf-8", "surrogateescape")) for ch in part]
    return out


def _matches(g: CompiledGrammar, text: str) -> bool:
    """test-grammar-integration.cpp's match_string."""
    m = GrammarMatcher(g, VOCAB)
    try:
        for tid, piece in _pieces(text):
            m.accept_piece(tid, piece)
    except GrammarError:
        return False
    return m.compiled.can_end[m.sid]


def test_the_source_tree_has_the_cases() -> None:
    assert len(CASES) >= 12 and sum(len(c.passing) + len(c.failing) for c in CASES) >= 100


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_llama_cpp_integration_cases(case) -> None:
    g = CompiledGrammar(parse_grammar(case.grammar))
    for text in case.passing:
        assert _matches(g, text), f"should match: {text!r}"
    for text in case.failing:
        assert not _matches(g, text), f"should not match: {text!r}"


# -- UTF-8 ------------------------------------------------------------------------------------------


def test_decode_utf8_as_llama_cpp() -> None:
    assert decode_utf8("h€".encode()) == ([104, 0x20AC], NO_PARTIAL)
    cps, partial = decode_utf8(b"a\xe2\x82")
    assert cps == [97] and partial == ((0xE2 & 0x0F) << 6 | 0x02, 1)
    assert decode_utf8(b"\xac!", partial) == ([0x20AC, 33], NO_PARTIAL)
    assert decode_utf8(b"!", partial) == ([], INVALID)  # not a continuation byte
    assert decode_utf8(b"\x80") == ([], INVALID)  # a lone continuation byte
    assert decode_utf8(b"ab\x00cd") == ([97, 98], NO_PARTIAL)  # a C string ends at NUL


def test_partial_utf8_across_tokens() -> None:
    vocab = _byte_vocab([b"\xe2\x82", b"\xac", b"\xe2"])  # 256: "€" cut after two bytes
    g = compile_grammar('root ::= "€" [a-z]')
    m = GrammarMatcher(g, vocab)
    allowed = m.allowed()
    assert allowed[256] and allowed[0xE2] and allowed[258] and not allowed[ord("a")]
    m.accept(256)
    assert m.partial[1] == 1
    allowed = m.allowed()
    assert allowed[257] and allowed[0xAC] and not allowed[0x80] and not allowed[ord("a")]
    m.accept(257)
    assert m.allowed()[ord("q")] and not m.can_end
    m.accept(ord("q"))
    assert m.can_end and np.flatnonzero(m.allowed()).tolist() == [EOS]


# -- tokens, the whole vocabulary, end of generation --------------------------------------------------


def test_token_elements_and_eog() -> None:
    vocab = _byte_vocab([b"<think>", b"</think>"])  # 256, 257
    g = compile_grammar("root ::= <[256]> (!<[257]>)* <[257]> [a-z]")
    m = GrammarMatcher(g, vocab)
    assert np.flatnonzero(m.allowed()).tolist() == [256]
    m.accept(256)
    allowed = m.allowed()
    assert allowed[257] and allowed[ord("x")] and allowed[258] and not allowed[EOS]
    m.accept(ord("x"))
    m.accept(257)
    assert not m.allows(257) and m.allows(ord("z")) and not m.allows(EOS)
    with pytest.raises(GrammarError, match="end of generation"):
        m.clone().accept(EOS)
    m.accept(ord("z"))
    assert m.allows(EOS) and m.can_end
    m.accept(EOS)  # end of generation leaves a complete grammar as it is


@pytest.mark.parametrize("path", sorted((LLAMA_CPP_SRC / "grammars").glob("*.gbnf")), ids=lambda p: p.name)
def test_trie_equals_the_one_token_check(path) -> None:
    """Along a random walk, the mask over the vocabulary is the one-token check of every token."""
    vocab = _byte_vocab([b'{"', b'":', b"true", b" [", b"\xe3\x81", b"\x82", "の".encode(), b"e4", b"\n\n"])
    m = GrammarMatcher(compile_grammar(path.read_text(encoding="utf-8")), vocab)
    rng = np.random.default_rng(0)
    for _ in range(30):
        mask = m.allowed()
        assert mask is not None
        assert mask.tolist() == [m.allows(t) for t in range(vocab.n_vocab)]
        choices = [t for t in np.flatnonzero(mask) if t != EOS]
        if not choices:
            break
        m.accept(int(rng.choice(choices)))


def test_clone_and_reset() -> None:
    g = compile_grammar('root ::= "ab" | "ac"')
    m = GrammarMatcher(g, VOCAB)
    m.accept(ord("a"))
    c = m.clone()
    c.accept(ord("b"))
    assert c.can_end and not m.can_end and m.allows(ord("c"))
    m.reset()
    assert np.flatnonzero(m.allowed()).tolist() == [ord("a")]


def test_the_compiled_grammar_is_shared_by_text() -> None:
    assert compile_grammar('root ::= "x"') is compile_grammar('root ::= "x"')


def test_ambiguous_grammars_are_bounded() -> None:
    # after n "a"s, every sequence of n pending "b"/"c" is a stack: 2**n of them, until the matcher refuses
    m = GrammarMatcher(compile_grammar('root ::= x\nx ::= "a" x "b" | "a" x "c" | "d"'), VOCAB)
    with pytest.raises(GrammarError, match="too ambiguous"):
        for _ in range(64):
            m.accept(ord("a"))


# -- lazy grammars ----------------------------------------------------------------------------------


def _feed(m: GrammarMatcher, text: bytes) -> None:
    for b in text:
        m.accept(b)


def test_lazy_word_trigger_replays_from_the_trigger() -> None:
    g = compile_grammar('root ::= "<tool>" [0-9]+ "</tool>"')
    m = GrammarMatcher(g, VOCAB, lazy=True, triggers=(GrammarTrigger(type=TriggerType.WORD, value="<tool>"),))
    assert m.allowed() is None and m.allows(ord("?")) and m.can_end
    _feed(m, b"Let me call <too")
    assert m.awaiting
    m.accept(ord("l"))
    m.accept(ord(">"))
    assert not m.awaiting and not m.can_end
    assert m.allows(ord("7")) and not m.allows(ord("x"))
    _feed(m, b"42</tool>")
    assert m.can_end


def test_lazy_pattern_starts_at_the_first_group() -> None:
    g = compile_grammar('root ::= "{" [a-z]* "}"')
    trig = GrammarTrigger(type=TriggerType.PATTERN, value=r"[\s\S]*?(\{)")
    m = GrammarMatcher(g, VOCAB, lazy=True, triggers=(trig,))
    _feed(m, b"text {")
    assert not m.awaiting and m.allows(ord("q")) and not m.allows(ord("{"))


def test_lazy_pattern_full_and_token_triggers() -> None:
    g = compile_grammar('root ::= "x" [0-9]')
    full = GrammarTrigger(type=TriggerType.PATTERN_FULL, value="x")
    m = GrammarMatcher(g, VOCAB, lazy=True, triggers=(full,))
    _feed(m, b"ax")
    assert m.awaiting  # "^x$" must match the whole text
    m = GrammarMatcher(g, VOCAB, lazy=True, triggers=(full,))
    m.accept(ord("x"))
    assert not m.awaiting and m.allows(ord("5"))
    vocab = _byte_vocab([b"x"])  # 256: a token trigger; its piece goes into the grammar
    m = GrammarMatcher(g, vocab, lazy=True, triggers=(GrammarTrigger(type=TriggerType.TOKEN, token=256),))
    m.accept(ord("x"))
    assert m.awaiting
    m.accept(256)
    assert not m.awaiting and m.allows(ord("5")) and not m.allows(ord("x"))


def test_expansion_without_text_is_bounded() -> None:
    # "e" may be empty, so root expands to e root "b" without consuming text: the stack grows forever
    # (llama.cpp's left-recursion check does not see through "e"); refused, quickly
    import time

    t0 = time.perf_counter()
    with pytest.raises(GrammarError, match="deeper than"):
        compile_grammar('root ::= e root "b" | "c"\ne ::= "a"?')
    assert time.perf_counter() - t0 < 5
    m = GrammarMatcher(compile_grammar('root ::= "(" root ")" | "x"'), VOCAB)
    with pytest.raises(GrammarError, match="deeper than"):
        for _ in range(5000):
            m.accept(ord("("))
