"""GPT-2 byte-level BPE (llama.cpp's `llm_tokenizer_bpe_session`).

Text is split into words by the pre-tokenizer, each word's UTF-8 bytes are spelled with GPT-2's printable
byte alphabet, and within a word the adjacent pair with the lowest merge rank (leftmost on ties) is merged
until no ranked pair is left. Words are cached, so common words cost one dict lookup.
"""

from __future__ import annotations

import codecs
import heapq

from .pretokenize import PreTokenizer
from .vocab import Vocab

__all__ = ["BYTE_DECODER", "BYTE_ENCODER", "BpeTokenizer"]


def _byte_encoder() -> dict[int, str]:
    """unicode_byte_to_utf8_map: printable bytes stand for themselves, the others for U+0100 onwards."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    enc = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in enc:
            enc[b] = chr(256 + n)
            n += 1
    return enc


BYTE_ENCODER: dict[int, str] = _byte_encoder()
BYTE_DECODER: dict[str, int] = {c: b for b, c in BYTE_ENCODER.items()}
# byte -> GPT-2 alphabet as a charmap codec table (one C call per word)
_ENCODE_TABLE = "".join(BYTE_ENCODER[b] for b in range(256))
_CACHE_LIMIT = 1 << 16
_CACHE_MAX_WORD = 64


class BpeTokenizer:
    """Tokenizes raw text fragments (special tokens already split off) into ids."""

    __slots__ = ("_byte_encode", "_cache", "_ignore_merges", "_merges", "_pre", "_t2i")

    def __init__(self, vocab: Vocab) -> None:
        assert vocab.pre is not None
        self._pre = PreTokenizer(vocab.pre)
        self._byte_encode = vocab.pre.byte_encode
        self._ignore_merges = vocab.ignore_merges
        self._merges = vocab.merges
        self._t2i = vocab.text_to_id
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of `text` to `out`."""
        cache = self._cache
        for word in self._pre.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._word(word)
                if len(word) <= _CACHE_MAX_WORD:
                    if len(cache) >= _CACHE_LIMIT:
                        cache.clear()
                    cache[word] = ids
            out.extend(ids)

    def _word(self, word: str) -> list[int]:
        if self._byte_encode:
            word = codecs.charmap_decode(word.encode("utf-8", "surrogatepass"), "strict", _ENCODE_TABLE)[0]
        t2i = self._t2i
        if self._ignore_merges:
            tid = t2i.get(word)
            if tid is not None:
                return [tid]
        out: list[int] = []
        for sym in self._merge(word):
            tid = t2i.get(sym)
            if tid is not None:
                out.append(tid)
            else:
                self._fallback(sym, out)
        return out

    def _fallback(self, sym: str, out: list[int]) -> None:
        # llama.cpp looks each byte of the symbol's UTF-8 up as a one-byte token (byte-encoded vocabularies;
        # only ASCII ones can exist as text) or as <0xXX> (raw UTF-8 vocabularies), skipping misses.
        t2i = self._t2i
        for b in sym.encode("utf-8", "surrogatepass"):
            key = (chr(b) if b < 0x80 else None) if self._byte_encode else f"<0x{b:02X}>"
            tid = t2i.get(key) if key is not None else None
            if tid is not None:
                out.append(tid)

    def _merge(self, word: str) -> list[str]:
        """The symbols left after merging; pairs merge by (rank, left position) as llama.cpp's queue."""
        syms = list(word)
        n = len(syms)
        if n < 2:
            return syms
        ranks = self._merges
        if n == 2:
            return [word] if (syms[0], syms[1]) in ranks else syms
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            r = ranks.get((syms[i], syms[i + 1]))
            if r is not None:
                heap.append((r, i, i + 1, 2))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            ls, rs = syms[left], syms[right]
            # stale entry: one side merged away, or the right one grown (the left one only grows by eating it)
            if not ls or not rs or len(ls) + len(rs) != size:
                continue
            syms[left] = ls + rs
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
                r = ranks.get((syms[left], syms[after]))
                if r is not None:
                    push(heap, (r, left, after, len(syms[left]) + len(syms[after])))
            before = prv[left]
            if before >= 0:
                r = ranks.get((syms[before], syms[left]))
                if r is not None:
                    push(heap, (r, before, left, len(syms[before]) + len(syms[left])))
        return [s for s in syms if s]
