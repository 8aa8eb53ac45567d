"""Model-free drafters that look the last tokens up in the sequence's own history.

- `NgramSimple` (llama.cpp's ngram-simple): the most recent earlier occurrence of the last `size_n`
  tokens; the tokens that followed it are the draft.
- `NgramMap` (ngram-map-k, and ngram-map-k4v with `key_only=False`): the same lookup, with statistics per
  key n-gram. map-k drafts what followed the key, no longer than the target accepted last time; map-k4v
  keeps up to four different m-grams seen after the key and drafts the dominant one (at least twice as
  frequent as all the others together), once the key was seen `min_hits` times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import NgramMapParams
from .drafter import DraftJob

__all__ = ["NgramMap", "NgramSimple", "find_matches"]

_MAX_VALUES = 4  # m-grams remembered per key (COMMON_NGRAM_MAX_VALUES)
_MAX_COUNT = 16380  # counts saturate here (COMMON_NGRAM_MAX_VALUE_COUNT)


def find_matches(arr: np.ndarray, pattern: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Every j in [lo, hi] (ascending) where arr[j : j + len(pattern)] equals pattern."""
    n = len(pattern)
    hi = min(hi, len(arr) - n)
    if hi < lo or n == 0:
        return np.zeros(0, np.int64)
    cand = np.flatnonzero(arr[lo : hi + 1] == pattern[0]) + lo  # cheap first filter, then the rest
    for k in range(1, n):
        if not len(cand):
            break
        cand = cand[arr[cand + k] == pattern[k]]
    return cand


def _key(tokens: list[int], last: int, n: int) -> np.ndarray:
    key = np.empty(n, np.int64)
    key[: n - 1] = tokens[len(tokens) - n + 1 :]
    key[n - 1] = last
    return key


class NgramSimple:
    """ngram-simple: draft what followed the most recent earlier occurrence of the last n tokens."""

    def __init__(self, params: NgramMapParams) -> None:
        self.n, self.m = params.size_n, params.size_m
        self.n_max = params.size_m

    def begin(self, seq: int, prompt: list[int], scope: str = "") -> None:
        pass  # it reads only the sequence's own history

    def draft(self, jobs: list[DraftJob]) -> None:
        for job in jobs:
            job.result = self._one(job.tokens, job.last)

    def _one(self, tokens: list[int], last: int) -> list[int]:
        cur, n, m = len(tokens), self.n, self.m
        if cur <= n + m + 1:  # llama.cpp wants at least n + m + 1 tokens of history
            return []
        arr = np.asarray(tokens, np.int64)
        hits = find_matches(arr, _key(tokens, last, n), 1, cur - n - 1)
        if not len(hits):
            return []
        pos = int(hits[-1])
        n_copy = min(m, cur - (pos + n))
        if n_copy < n:
            return []
        return tokens[pos + n : pos + n + n_copy]

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        pass


@dataclass(slots=True)
class _Value:
    idx: int  # where this m-gram starts in the history
    count: int = 0
    n_accepted: int = 0  # tokens the target accepted the last time it was drafted


@dataclass(slots=True)
class _KeyStats:
    idx: int  # an occurrence of the key n-gram
    stat_idx: int = 0  # history scanned for values up to here
    count: int = 0
    values: list[_Value] = field(default_factory=list)


@dataclass(slots=True)
class _SeqMap:
    keys: dict[bytes, _KeyStats] = field(default_factory=dict)
    last: tuple[_KeyStats, int] | None = None  # the key and value of the last draft


class NgramMap:
    """ngram-map-k (`key_only`) and ngram-map-k4v: n-gram lookup with per-key statistics."""

    def __init__(self, params: NgramMapParams, key_only: bool) -> None:
        self.n, self.m, self.min_hits = params.size_n, params.size_m, params.min_hits
        self.key_only = key_only
        self.n_max = params.size_m
        self._maps: dict[int, _SeqMap] = {}

    def begin(self, seq: int, prompt: list[int], scope: str = "") -> None:
        self._maps[seq] = _SeqMap()  # indices point into the history: a new history starts afresh

    def draft(self, jobs: list[DraftJob]) -> None:
        for job in jobs:
            job.result = self._one(self._maps.setdefault(job.seq, _SeqMap()), job.tokens, job.last)

    def _one(self, smap: _SeqMap, tokens: list[int], last: int) -> list[int]:
        smap.last = None
        cur, n, m = len(tokens), self.n, self.m
        if cur < 2 * n + m:
            return []
        arr = np.asarray(tokens, np.int64)
        key = _key(tokens, last, n)
        hits = find_matches(arr, key, 1, cur - n - m - 2)  # the m tokens after a match lie in the history
        if not len(hits):
            return []
        pos = int(hits[-1])
        stats = smap.keys.get(key.tobytes())
        if stats is None:
            stats = smap.keys[key.tobytes()] = _KeyStats(pos)
        stats.count = min(stats.count + 1, _MAX_COUNT)
        if self.key_only:
            if not stats.values:
                stats.values.append(_Value(pos, 0, m))
            smap.last = (stats, 0)
            return tokens[pos + n : pos + n + min(m, stats.values[0].n_accepted)]
        if stats.count < self.min_hits:
            return []
        self._count_values(stats, arr, key, pos)
        best = max(range(len(stats.values)), key=lambda v: stats.values[v].count)
        top = stats.values[best].count
        others = sum(v.count for v in stats.values) - top
        if others > 0 and top < 2 * others:  # no dominant continuation
            return []
        smap.last = (stats, best)
        v = stats.values[best]
        return tokens[v.idx : v.idx + min(m, v.n_accepted)]

    def _count_values(self, stats: _KeyStats, arr: np.ndarray, key: np.ndarray, pos: int) -> None:
        """Count the m-grams after each occurrence of the key from `stat_idx` to `pos`."""
        n, m = self.n, self.m
        for i in find_matches(arr, key, stats.stat_idx, pos).tolist():
            start = i + n
            for v in stats.values:
                if np.array_equal(arr[start : start + m], arr[v.idx : v.idx + m]):
                    v.count = min(v.count + 1, _MAX_COUNT)
                    break
            else:
                if len(stats.values) < _MAX_VALUES:
                    stats.values.append(_Value(start, 1, m))
        stats.stat_idx = pos + 1

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        smap = self._maps.get(seq)
        if is_other or smap is None or smap.last is None:
            return
        stats, v = smap.last
        stats.values[v].n_accepted = n_accepted
