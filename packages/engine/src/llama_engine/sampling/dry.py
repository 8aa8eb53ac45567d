"""DRY ("don't repeat yourself") repetition penalty, as llama.cpp's ``llama_sampler_dry``.

DRY penalises a token that would extend a sequence already seen in the last ``dry_penalty_last_n``
tokens, by ``multiplier * base ** (length - allowed_length)``. Sequence breakers (strings such as
"\\n") stop a repetition: every token whose text contains a breaker, or ends with its beginning
(then followed by the tokens of the rest of the breaker), restarts the match. Finding those tokens
scans the whole vocabulary, so the result is cached per vocabulary and breaker list.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numba import njit

__all__ = ["DryBreakers", "DryVocab", "dry_apply"]

_MAX_CHAR_LEN = 40  # llama_sampler_init_dry: breakers are cut to 40 bytes
_MAX_SEQ_LEN = 20  # ... and their tail tokenizations to 20 tokens
_CACHE_SIZE = 16  # breaker lists kept per vocabulary


class DryBreakers:
    """Processed sequence breakers: for each head token, the tails that complete a breaker.

    Arrays (flat, numba friendly): ``head_start[tok]`` first entry of tok or -1, ``head_len[tok]``;
    entry e's tail is ``tail_tok[tail_off[e]:tail_off[e + 1]]``; ``single[tok]`` is 1 when one
    entry of tok has an empty tail (the token alone is a breaker, DRY never penalises it).
    """

    __slots__ = ("head_len", "head_start", "single", "tail_off", "tail_tok")

    def __init__(self, n_vocab: int, entries: dict[int, list[tuple[int, ...]]]) -> None:
        self.head_start = np.full(n_vocab, -1, dtype=np.int32)
        self.head_len = np.zeros(n_vocab, dtype=np.int32)
        self.single = np.zeros(n_vocab, dtype=np.uint8)
        offs = [0]
        toks: list[int] = []
        e = 0
        for head in sorted(entries):
            tails = entries[head]
            self.head_start[head] = e
            self.head_len[head] = len(tails)
            for tail in tails:
                toks.extend(tail)
                offs.append(len(toks))
                if not tail:
                    self.single[head] = 1
                e += 1
        self.tail_off = np.asarray(offs, dtype=np.int32)
        self.tail_tok = np.asarray(toks, dtype=np.int32)


class DryVocab:
    """What DRY needs from a tokenizer, for one model.

    ``pieces[t]``: the bytes of token t detokenized alone with special tokens rendered (llama.cpp
    ``vocab.detokenize({t}, true)``). ``tokenize(text)``: token ids of ``text`` without BOS and
    without parsing special tokens (``vocab.tokenize(text, false, false)``).
    """

    def __init__(self, pieces: Sequence[bytes], tokenize: Callable[[bytes], Sequence[int]]) -> None:
        self.pieces = list(pieces)
        self.tokenize = tokenize
        lengths = np.fromiter((len(p) for p in self.pieces), dtype=np.int64, count=len(self.pieces))
        self._ends = np.cumsum(lengths)
        self._blob = np.frombuffer(b"".join(self.pieces), dtype=np.uint8)
        self._cache: dict[tuple[str, ...], DryBreakers] = {}

    @property
    def n_vocab(self) -> int:
        return len(self.pieces)

    def breakers(self, seq_breakers: Sequence[str]) -> DryBreakers:
        """Processed breakers for this list (``get_overlapping_token_sequences``), cached."""
        key = tuple(seq_breakers)
        hit = self._cache.pop(key, None)
        if hit is None:
            hit = DryBreakers(self.n_vocab, self._process(key))
            if len(self._cache) >= _CACHE_SIZE:
                del self._cache[next(iter(self._cache))]  # least recently used
        self._cache[key] = hit
        return hit

    def _tokens_with_byte(self, b: int) -> np.ndarray:
        pos = np.flatnonzero(self._blob == b)
        return np.unique(np.searchsorted(self._ends, pos, side="right"))

    def _process(self, seq_breakers: tuple[str, ...]) -> dict[int, list[tuple[int, ...]]]:
        entries: dict[int, list[tuple[int, ...]]] = {}
        for text in seq_breakers:
            s = text.encode("utf-8")[:_MAX_CHAR_LEN]
            if not s:
                continue
            for t in self._tokens_with_byte(s[0]).tolist():
                word = self.pieces[t]
                tails = entries.setdefault(t, [])
                if s in word:
                    if () not in tails:
                        tails.append(())
                    continue
                # the token ends with a prefix of the breaker: the tail is the rest, tokenized
                pos = word.find(s[:1])
                while pos != -1:
                    i = 1
                    match = True
                    while i < len(s) and i + pos < len(word):
                        if word[pos + i] != s[i]:
                            match = False
                            break
                        i += 1
                    if match:
                        tail = tuple(int(x) for x in self.tokenize(s[i:]))[:_MAX_SEQ_LEN]
                        if tail not in tails:
                            tails.append(tail)
                    pos = word.find(s[:1], pos + 1)
                if not tails:
                    del entries[t]
        return entries


@njit(cache=True, nogil=True)
def _rat(ring, first, size, i):
    # ring_buffer::rat(i): the i-th token counting back from the newest
    return ring[(first + size - i - 1) % ring.shape[0]]


@njit(cache=True, nogil=True)
def dry_apply(
    ids, logits, n, ring, meta, head_start, head_len, tail_off, tail_tok, single,
    multiplier, base, allowed_length, last_n, repeat_count, max_rep, identity,
):  # fmt: skip
    """``llama_sampler_dry_apply`` (enabled). ring/meta: the token history ring buffer
    (meta = first, size, pos); repeat_count: int32[last_n] and max_rep: int32[n_vocab] (all -1)
    are scratch, max_rep is restored to -1 before returning. identity: the candidates are the
    whole vocabulary in id order (only the tokens found in step 3 are visited).
    """
    first = meta[0]
    size = meta[1]
    n_vocab = head_start.shape[0]
    last_n_repeat = min(size, last_n)
    if last_n_repeat <= allowed_length:
        return

    # step 1: the nearest restart sequence limits the repetition length
    rep_limit = last_n_repeat
    for i in range(last_n_repeat):
        token = _rat(ring, first, size, i)
        if token < 0 or token >= n_vocab or head_start[token] < 0:
            continue
        longest = -1
        e0 = head_start[token]
        for e in range(e0, e0 + head_len[token]):
            seq_len = tail_off[e + 1] - tail_off[e]
            if seq_len > longest and seq_len <= i:
                match = True
                for off in range(seq_len):
                    if tail_tok[tail_off[e] + off] != _rat(ring, first, size, i - off - 1):
                        match = False
                        break
                if match:
                    longest = seq_len
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed_length:
        return

    # step 2: reverse Z-algorithm, lengths of suffixes repeated earlier in the context
    for i in range(last_n_repeat):
        repeat_count[i] = 0
    last = last_n_repeat - 1
    rt = 0
    lt = 0
    for k in range(1, last_n_repeat):
        if k > rt:
            m = 0
            while m + k < last_n_repeat and _rat(ring, first, size, m) == _rat(ring, first, size, m + k):
                m += 1
            repeat_count[last - k] = min(m, rep_limit)
            if m > 0:
                lt = k
                rt = k + m - 1
        else:
            p = k - lt
            right_part_len = rt - k + 1
            if repeat_count[last - p] < right_part_len:
                repeat_count[last - k] = min(repeat_count[last - p], rep_limit)
            else:
                j = rt + 1
                while j < last_n_repeat and _rat(ring, first, size, j) == _rat(ring, first, size, j - k):
                    j += 1
                repeat_count[last - k] = min(j - k, rep_limit)
                lt = k
                rt = j - 1

    # step 3: the longest repeat each next token would extend
    touched = np.empty(last_n_repeat, dtype=np.int32)
    n_touched = 0
    for i in range(last_n_repeat - 1):
        repeat_len = repeat_count[i]
        if repeat_len >= allowed_length:
            token = _rat(ring, first, size, last_n_repeat - 2 - i)
            if token < 0 or token >= n_vocab:
                continue
            if max_rep[token] < 0:
                touched[n_touched] = token
                n_touched += 1
            if max_rep[token] < repeat_len:
                max_rep[token] = repeat_len

    # step 4: penalties; the exponent is clamped so that base ** exp stays a finite float
    max_exponent = 0
    if base > np.float32(1.000001):
        max_exponent = int(np.float32(88.7228391) / np.float32(math.log(base)))
    m = n_touched if identity else n
    for j in range(m):
        i = touched[j] if identity else j
        tok = ids[i]
        if tok < 0 or tok >= n_vocab:
            continue
        r = max_rep[tok]
        if r >= 0 and single[tok] == 0:
            repeat_exp = r - allowed_length
            if max_exponent > 0 and repeat_exp > max_exponent:
                repeat_exp = max_exponent
            penalty = np.float32(np.float64(multiplier) * math.pow(np.float64(base), np.float64(repeat_exp)))
            logits[i] = logits[i] - penalty
    for j in range(n_touched):
        max_rep[touched[j]] = -1
