"""ngram-mod: one hashed table, shared by all sequences, from `n_match` tokens to the token that followed.

llama.cpp's common_ngram_mod: 4M entries, a 64-bit multiplicative hash of the n tokens modulo the table
size, the newest follower wins. A draft chains lookups from the last n tokens; fewer than `n_min` found
tokens is no draft. The table is reset when a quarter of it is used, or after five drafts in a row of
one sequence had less than a quarter accepted. The table holds one scope's text (API key,
`GenerationRequest.cache_scope`): a request of another scope starting resets it, and a sequence whose
scope no longer owns the table neither adds to it nor drafts from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import NgramModParams
from .drafter import DraftJob

__all__ = ["NgramMod"]

_SIZE = 4 * 1024 * 1024
_MUL = 6364136223846793005
_MASK = (1 << 64) - 1
_EMPTY = -1
_ADD_EVERY = 32  # new n-grams of a growing history are added in chunks of at least this many


@dataclass(slots=True)
class _SeqInfo:
    i_last: int = 0  # history added to the table up to here
    n_draft_last: int = 0
    n_low: int = 0  # drafts in a row with less than a quarter accepted
    scope: str = ""  # whose text the sequence is


class NgramMod:
    """The ngram-mod drafter."""

    def __init__(self, params: NgramModParams, size: int = _SIZE) -> None:
        self.n = params.n_match
        self.n_min, self.n_max = params.n_min, params.n_max
        self.entries = np.full(size, _EMPTY, np.int32)
        self.used = 0
        self.scope = ""  # whose text the table holds
        self._seqs: dict[int, _SeqInfo] = {}

    def reset(self) -> None:
        self.entries.fill(_EMPTY)
        self.used = 0

    def _hashes(self, arr: np.ndarray, count: int) -> np.ndarray:
        """Table index of the n-gram starting at each of arr[0 .. count-1]."""
        h = np.zeros(count, np.uint64)
        with np.errstate(over="ignore"):  # the hash is arithmetic modulo 2^64
            for i in range(self.n):
                h = h * np.uint64(_MUL) + arr[i : i + count].astype(np.uint64)
        return (h % np.uint64(len(self.entries))).astype(np.int64)

    def _index(self, window: list[int]) -> int:
        h = 0
        for t in window:
            h = (h * _MUL + t) & _MASK
        return h % len(self.entries)

    def _add(self, tokens: list[int], lo: int, hi: int) -> None:
        """Add the n-grams starting at lo .. hi-1 (each with its follower)."""
        if hi <= lo:
            return
        arr = np.asarray(tokens[lo : hi + self.n], np.int64)
        idx = self._hashes(arr, hi - lo)
        self.used += int(np.count_nonzero(self.entries[np.unique(idx)] == _EMPTY))
        self.entries[idx] = arr[self.n : self.n + hi - lo]  # repeated indices: the last (newest) wins

    def begin(self, seq: int, prompt: list[int], scope: str = "") -> None:
        if scope != self.scope:
            self.reset()
            self.scope = scope
        info = self._seqs[seq] = _SeqInfo(scope=scope)
        n = self.n
        if len(prompt) < n:
            return
        self._add(prompt, 0, len(prompt) - n)
        info.i_last = len(prompt) - n
        if self.used / len(self.entries) > 0.25:
            self.reset()

    def draft(self, jobs: list[DraftJob]) -> None:
        for job in jobs:
            job.result = self._one(self._seqs.setdefault(job.seq, _SeqInfo()), job.tokens, job.last)

    def _one(self, info: _SeqInfo, tokens: list[int], last: int) -> list[int]:
        info.n_draft_last = 0
        cur, n = len(tokens), self.n
        if cur < n or info.scope != self.scope:
            return []
        if info.i_last + _ADD_EVERY < cur:
            self._add(tokens, info.i_last, cur - n)
            info.i_last = cur - n
        window = [*tokens[cur - n + 1 :], last]
        out: list[int] = []
        for i in range(self.n_max):
            token = int(self.entries[self._index(window[i : i + n])])
            if token == _EMPTY:
                if i < self.n_min:
                    return []
                break
            window.append(token)
            out.append(token)
        info.n_draft_last = len(out)
        return out

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        info = self._seqs.get(seq)
        if is_other or info is None or info.n_draft_last == 0:
            return
        if n_accepted / info.n_draft_last < 0.25:
            info.n_low += 1
            if info.n_low >= 5:
                self.reset()
                info.n_low = info.i_last = 0
        else:
            info.n_low = 0
