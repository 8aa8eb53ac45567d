"""WordPiece (llama.cpp's `llm_tokenizer_wpm_session`, LLAMA_VOCAB_TYPE_WPM, `tokenizer.ggml.model` = "bert").

Text is normalized and split into words as BERT's basic tokenizer does, with llama.cpp's own tables: each
codepoint is mapped to the base character of its decomposition (llama.cpp's one-to-one NFD), lowercased by
its one-to-one map, accent marks and control characters are dropped, whitespace separates words, and
punctuation, ASCII symbols and CJK ideographs are words of their own. Each word, with U+2581 in front, is
then covered greedily by the longest vocabulary tokens from the left; a word that cannot be covered becomes
the unknown token.
"""

from __future__ import annotations

import bisect
import functools

from . import _unicode_data as _ud
from .pretokenize import unicode_flags
from .vocab import Vocab

__all__ = ["WpmTokenizer", "wpm_words"]

_SPACE = "\u2581"
_CACHE_LIMIT = 1 << 16
_WHITESPACE = frozenset(chr(c) for c in _ud.WHITESPACE)
# is_chinese_char; llama.cpp (after HF's Rust code) starts the fifth extension at 0x2B920, not 0x2B820
_CJK = (
    (0x04E00, 0x09FFF),
    (0x03400, 0x04DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0x0F900, 0x0FAFF),
    (0x2F800, 0x2FA1F),
)


@functools.cache
def _lower_table() -> dict[int, int]:
    """unicode_tolower as a str.translate table."""
    low = _ud.LOWERCASE
    return {low[i]: low[i + 1] for i in range(0, len(low), 2)}


@functools.cache
def _nfd_table() -> tuple[list[int], list[int], list[int]]:
    nfd = _ud.NFD
    return list(nfd[0::3]), list(nfd[1::3]), list(nfd[2::3])


def _nfd(cp: int) -> int:
    """unicode_cpts_normalize_nfd for one codepoint: the range holding it maps it to one codepoint."""
    firsts, lasts, bases = _nfd_table()
    i = bisect.bisect_right(firsts, cp) - 1
    return bases[i] if i >= 0 and cp <= lasts[i] else cp


class _Kind:
    """What preprocessing does with a codepoint (after NFD), by llama.cpp's category flags."""

    SPLIT = 0  # whitespace: ends the word
    DROP = 1  # NUL, U+FFFD, control characters, and accent marks when stripping accents
    ALONE = 2  # punctuation, ASCII symbols, CJK ideographs: a word of its own
    KEEP = 3


@functools.lru_cache(maxsize=1 << 16)
def _kind(cp: int, strip_accents: bool) -> int:
    if chr(cp) in _WHITESPACE:
        return _Kind.SPLIT
    flags = unicode_flags(cp)
    if cp == 0 or cp == 0xFFFD or flags & _ud.CONTROL:
        return _Kind.DROP
    if strip_accents and flags & _ud.ACCENT_MARK:
        return _Kind.DROP
    if flags & _ud.PUNCTUATION or (cp < 0x7F and flags & _ud.SYMBOL) or any(a <= cp <= b for a, b in _CJK):
        return _Kind.ALONE
    return _Kind.KEEP


def wpm_words(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """llm_tokenizer_wpm_session::preprocess: the normalized words of `text`, in order."""
    lower = _lower_table()
    words: list[str] = []
    word: list[str] = []
    for ch in text:
        cp = ord(ch)
        if strip_accents:
            cp = _nfd(cp)
        kind = _kind(cp, strip_accents)
        if kind == _Kind.DROP:
            continue
        if kind == _Kind.SPLIT:
            if word:
                words.append("".join(word))
                word = []
            continue
        s = chr(lower.get(cp, cp)) if lowercase else chr(cp)
        if kind == _Kind.ALONE:
            if word:
                words.append("".join(word))
                word = []
            words.append(s)
        else:
            word.append(s)
    if word:
        words.append("".join(word))
    return words


class WpmTokenizer:
    """Tokenizes raw text fragments (special tokens already split off) into ids."""

    __slots__ = ("_cache", "_lowercase", "_max_len", "_strip_accents", "_t2i", "_unk")

    def __init__(self, vocab: Vocab) -> None:
        self._t2i = vocab.text_to_id
        self._unk = vocab.unk_id
        self._lowercase = vocab.lowercase
        self._strip_accents = vocab.strip_accents
        # llama.cpp bounds the match by the longest token in bytes; in characters the same tokens match
        self._max_len = max((len(t) for t in vocab.tokens), default=0)
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of `text` to `out`."""
        cache = self._cache
        for word in wpm_words(text, self._lowercase, self._strip_accents):
            ids = cache.get(word)
            if ids is None:
                ids = self._word(word)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)

    def _word(self, word: str) -> list[int]:
        t2i = self._t2i
        text = _SPACE + word
        n = len(text)
        ids: list[int] = []
        i = 0
        while i < n:
            for j in range(min(n, i + self._max_len + 1), i, -1):
                tid = t2i.get(text[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                ids = []  # one uncovered character discards the whole word
                break
        if not ids:
            if self._unk is None:
                raise ValueError(f"the vocabulary has no unknown token for the word {word!r}")
            ids = [self._unk]
        return ids
