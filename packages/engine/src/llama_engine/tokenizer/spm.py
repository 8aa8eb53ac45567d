"""SentencePiece-style tokenizer (llama.cpp's `llm_tokenizer_spm_session`, LLAMA_VOCAB_TYPE_SPM).

Spaces become U+2581; starting from single characters, the adjacent pair whose concatenation is a token
with the highest score (leftmost on ties) is merged until none is left; characters that never became a
token are spelled with `<0xXX>` byte tokens.

llama.cpp runs the merge over a whole fragment. A merge can only produce a vocabulary token, so it never
crosses a point that no token spans; we cut fragments before each U+2581 whose preceding character never
precedes U+2581 inside a token, merge the pieces independently (the result is the same) and cache them.
"""

from __future__ import annotations

import heapq
import re

from .vocab import Vocab

__all__ = ["SpmTokenizer"]

_SPACE = "\u2581"
_CACHE_LIMIT = 1 << 16
_CACHE_MAX_PIECE = 64


class SpmTokenizer:
    """Tokenizes escaped text fragments (spaces already replaced by U+2581) into ids."""

    __slots__ = ("_bytes", "_cache", "_cut", "_scores", "_t2i")

    def __init__(self, vocab: Vocab) -> None:
        self._t2i = vocab.text_to_id
        self._scores = vocab.scores
        self._cache: dict[str, list[int]] = {}
        # characters that appear right before U+2581 inside some token: no cut after them
        glued = {
            t[i - 1]
            for t in vocab.tokens
            if t.find(_SPACE, 1) > 0
            for i in range(1, len(t))
            if t[i] == _SPACE
        }
        lookbehind = "(?<![" + "".join(re.escape(c) for c in sorted(glued)) + "])" if glued else ""
        self._cut = re.compile(lookbehind + "(?=" + _SPACE + ")")
        self._bytes = [self._byte_token(vocab, b) for b in range(256)]

    @staticmethod
    def _byte_token(vocab: Vocab, b: int) -> int | None:
        # llama_vocab::byte_to_token: <0xXX>, else the byte itself as a one-character token
        tid = vocab.text_to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = vocab.text_to_id.get(chr(b))
        return tid if tid is not None else vocab.unk_id

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of `text` (already escaped) to `out`."""
        cache = self._cache
        for piece in self._cut.split(text):
            if not piece:
                continue
            ids = cache.get(piece)
            if ids is None:
                ids = self._piece(piece)
                if len(piece) <= _CACHE_MAX_PIECE:
                    if len(cache) >= _CACHE_LIMIT:
                        cache.clear()
                    cache[piece] = ids
            out.extend(ids)

    def _piece(self, text: str) -> list[int]:
        t2i = self._t2i
        out: list[int] = []
        for sym in self._merge(text):
            tid = t2i.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            for b in sym.encode("utf-8", "surrogatepass"):
                tid = self._bytes[b]
                if tid is None:
                    raise ValueError(f"the vocabulary has no token for byte 0x{b:02X} and no unknown token")
                out.append(tid)
        return out

    def _merge(self, text: str) -> list[str]:
        syms = list(text)
        n = len(syms)
        if n < 2:
            return syms
        t2i, scores = self._t2i, self._scores
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        # max-heap on score, then min on left position: key (-score, left)
        heap = []
        for i in range(n - 1):
            tid = t2i.get(syms[i] + syms[i + 1])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, 2))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            ls, rs = syms[left], syms[right]
            if not ls or not rs or len(ls) + len(rs) != size:
                continue
            merged = ls + rs
            syms[left] = merged
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            before = prv[left]
            if after >= 0:
                prv[after] = left
            if before >= 0:
                tid = t2i.get(syms[before] + merged)
                if tid is not None:
                    push(heap, (-scores[tid], before, left, len(syms[before]) + len(merged)))
            if after >= 0:
                tid = t2i.get(merged + syms[after])
                if tid is not None:
                    push(heap, (-scores[tid], left, after, len(merged) + len(syms[after])))
        return [s for s in syms if s]
