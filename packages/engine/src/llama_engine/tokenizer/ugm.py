"""Unigram tokenizer (llama.cpp's `llm_tokenizer_ugm_session`, LLAMA_VOCAB_TYPE_UGM, `tokenizer.ggml.model` =
"t5"), as SentencePiece's unigram model.

Text is first normalized by SentencePiece's precompiled character map (`tokenizer.ggml.precompiled_charsmap`:
a double-array trie of byte sequences and the strings that replace them), spaces become U+2581 (one before
the text, and runs of spaces merged when the vocabulary says so). Then the Viterbi path over codepoint
positions picks the tokenization with the highest sum of token scores; a codepoint no token covers is the
unknown token, and runs of unknown tokens are one.
"""

from __future__ import annotations

import numpy as np

from .vocab import TokenAttr, Vocab

__all__ = ["CharsMap", "UgmTokenizer"]

_SPACE = "\u2581"
_UNKNOWN_PENALTY = np.float32(10.0)
_MATCHED = int(TokenAttr.NORMAL | TokenAttr.USER_DEFINED | TokenAttr.UNUSED)
_CACHE_LIMIT = 1 << 14
_CACHE_MAX_TEXT = 256


class CharsMap:
    """SentencePiece's precompiled normalization map: an XOR-compressed compact double array (XCDA) over
    input bytes whose leaves index NUL-terminated replacement strings."""

    __slots__ = ("_array", "_replacements")

    def __init__(self, blob: bytes) -> None:
        if len(blob) < 4:
            raise ValueError("precompiled_charsmap is too small for its size header")
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):
            raise ValueError("precompiled_charsmap's trie runs past its end")
        # one bit-packed node per uint32: BASE in bits 10-30 (shifted by 8 when bit 9 is set), LCHECK in
        # bits 0-7 (and 31), LEAF in bit 8
        self._array: list[int] = np.frombuffer(blob, "<u4", size // 4, 4).tolist()
        self._replacements = blob[4 + size :]

    def _node(self, index: int) -> int:
        if index >= len(self._array):
            raise ValueError("precompiled_charsmap: index outside its trie")
        return self._array[index]

    @staticmethod
    def _base(node: int) -> int:
        return (node >> 10) << ((node & (1 << 9)) >> 6)

    def longest_match(self, data: bytes, start: int) -> tuple[int, bytes] | None:
        """(bytes consumed, replacement) for the longest prefix of `data[start:]` the map has, or None."""
        best_len = 0
        best_value = 0
        index = self._base(self._node(0))
        for pos in range(start, len(data)):
            c = data[pos]
            if c == 0:
                break
            index ^= c
            node = self._node(index)
            if node & ((1 << 31) | 0xFF) != c:  # LCHECK: not a child of the previous node
                break
            is_leaf = (node >> 8) & 1
            index ^= self._base(node)
            if is_leaf:
                best_len = pos - start + 1
                best_value = self._node(index) & ((1 << 31) - 1)
        if best_len == 0:
            return None
        repl = self._replacements
        if best_value >= len(repl):
            raise ValueError("precompiled_charsmap: replacement index outside the map")
        end = repl.find(b"\0", best_value)
        if end == -1:
            raise ValueError("precompiled_charsmap: unterminated replacement string")
        return best_len, repl[best_value:end]


def _utf8_length(data: bytes, pos: int) -> int:
    """Bytes in the UTF-8 sequence at `pos` as unicode_cpt_from_utf8 accepts it, 0 when it rejects it."""
    b = data[pos]
    n = 1 if b < 0x80 else 2 if b >> 5 == 6 else 3 if b >> 4 == 14 else 4 if b >> 3 == 30 else 0
    if n == 0 or pos + n > len(data):
        return 0
    if any(data[pos + k] >> 6 != 2 for k in range(1, n)):
        return 0
    return n


class UgmTokenizer:
    """Tokenizes raw text fragments (special tokens already split off) into ids."""

    __slots__ = (
        "_cache",
        "_charsmap",
        "_max_len",
        "_merge_spaces",
        "_prefix_space",
        "_scores",
        "_space",
        "_t2i",
        "_unk",
        "_unk_score",
        "_user_prefixes",
    )

    def __init__(self, vocab: Vocab) -> None:
        attrs = vocab.matcher_attrs if vocab.matcher_attrs is not None else vocab.attrs
        texts = vocab.tokens
        # the token trie holds normal, user-defined and unused tokens; user-defined ones score 0
        self._t2i = {
            texts[i].encode("utf-8", "surrogatepass"): i for i, a in enumerate(attrs) if a & _MATCHED
        }
        scores = np.asarray(vocab.scores, np.float32)
        normal = np.fromiter((a & TokenAttr.NORMAL for a in attrs), np.bool_, len(attrs))
        min_score = scores[normal].min() if normal.any() else np.float32(np.finfo(np.float32).max)
        self._unk_score = float(np.float32(min_score - _UNKNOWN_PENALTY))  # float arithmetic, as llama.cpp
        user = [
            texts[i].encode("utf-8", "surrogatepass")
            for i, a in enumerate(attrs)
            if a & TokenAttr.USER_DEFINED
        ]
        self._scores = [
            0.0 if a & TokenAttr.USER_DEFINED else float(s)
            for a, s in zip(attrs, scores.tolist(), strict=True)
        ]
        # every prefix of a user-defined token: llama.cpp passes the longest such prefix through unnormalized
        self._user_prefixes = {u[:k] for u in user for k in range(1, len(u) + 1)}
        self._max_len = max((len(t.decode("utf-8", "surrogatepass")) for t in self._t2i), default=0)
        self._unk = vocab.unk_id
        self._charsmap = CharsMap(vocab.charsmap) if vocab.charsmap else None
        self._space = _SPACE if vocab.escape_whitespaces else " "
        self._prefix_space = vocab.add_space_prefix
        self._merge_spaces = vocab.remove_extra_whitespaces
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of `text` to `out`."""
        ids = self._cache.get(text)
        if ids is None:
            ids = self._viterbi(self.normalize(text))
            if len(text) <= _CACHE_MAX_TEXT:
                if len(self._cache) >= _CACHE_LIMIT:
                    self._cache.clear()
                self._cache[text] = ids
        out.extend(ids)

    # ---- normalization ----

    def _prefix(self, data: bytes, pos: int) -> tuple[bytes, int]:
        """normalize_prefix: (normalized bytes, input bytes consumed) at `pos`."""
        if self._user_prefixes:
            n = 0
            while pos + n < len(data) and data[pos : pos + n + 1] in self._user_prefixes:
                n += 1
            if n:
                return data[pos : pos + n], n
        if self._charsmap is not None:
            match = self._charsmap.longest_match(data, pos)
            if match is not None:
                return match[1], match[0]
        n = _utf8_length(data, pos)
        return (data[pos : pos + n], n) if n else ("\ufffd".encode(), 1)

    def normalize(self, text: str) -> bytes:
        """The UTF-8 the Viterbi search runs on (llm_tokenizer_ugm_session::normalize). It can be invalid:
        llama.cpp passes a prefix of a user-defined token through even when it ends inside a character."""
        data = text.encode("utf-8", "surrogatepass")
        space = self._space.encode()
        out = bytearray()
        prepended = in_word = False
        pos = 0
        while pos < len(data):
            chunk, consumed = self._prefix(data, pos)
            for c in chunk:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (self._prefix_space and not prepended) or self._merge_spaces:
                            out += space
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not self._merge_spaces:
                        out += space
            pos += consumed
        return bytes(out)

    # ---- the best path ----

    def _viterbi(self, data: bytes) -> list[int]:
        if not data:
            return []
        unk = self._unk
        if unk is None:
            raise ValueError("the vocabulary has no unknown token")
        # llama.cpp steps by the length its lead byte announces; only results at these offsets are ever
        # read again, and a token (valid UTF-8) starting at one spans whole steps, one per character
        bounds = [0]
        while bounds[-1] < len(data):
            pos = bounds[-1]
            b = data[pos]
            bounds.append(
                pos + min(1 if b < 0xC0 else 2 if b < 0xE0 else 3 if b < 0xF0 else 4, len(data) - pos)
            )
        n = len(bounds) - 1
        t2i, scores, max_len, unk_score = self._t2i, self._scores, self._max_len, self._unk_score
        # best[k]: score of the best path to step k, its last token, the step where that token starts
        best_score = [-np.inf] * (n + 1)
        best_token = [unk] * (n + 1)
        best_start = [0] * (n + 1)
        best_score[0] = 0.0
        for k in range(n):
            here = best_score[k]
            start = bounds[k]
            single = False
            for j in range(k + 1, min(n, k + max_len) + 1):
                tid = t2i.get(data[start : bounds[j]])
                if tid is None:
                    continue
                if j == k + 1:
                    single = True
                score = here + scores[tid]
                if score > best_score[j]:
                    best_score[j], best_token[j], best_start[j] = score, tid, k
            if not single:
                score = here + unk_score
                if score > best_score[k + 1]:
                    best_score[k + 1], best_token[k + 1], best_start[k + 1] = score, unk, k
        ids: list[int] = []
        prev_unknown = False
        pos = n
        while True:
            tid = best_token[pos]
            is_unknown = tid == unk
            if not (prev_unknown and is_unknown):
                ids.append(tid)
            if best_start[pos] == 0:
                break
            prev_unknown = is_unknown
            pos = best_start[pos]
        ids.reverse()
        return ids
