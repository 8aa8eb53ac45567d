"""Embedding jobs: a prompt evaluated chunk by chunk on the embedding sequence, then pooled.

A job runs under the scheduler's token budget like a prompt: each step takes what the budget leaves
after decode tokens, so a long input never stalls concurrent streams. Only the rows its pooling reads are
asked for (all for mean and none, the first for cls, the last for last and rank).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .handles import EmbeddingHandle
from .requests import EmbeddingRequest, Pooling

__all__ = ["EmbeddingJob", "normalize", "pool"]


@dataclass(slots=True, eq=False)
class EmbeddingJob:
    """One embedding request in progress."""

    request: EmbeddingRequest
    handle: EmbeddingHandle
    arrival: float  # when it was submitted: prompt and embedding chunks are served oldest first
    prompt: np.ndarray = field(init=False)  # int32 [n]
    rows: np.ndarray | None = None  # float32 [n_rows, n_embd]: the hidden states pooling reads
    n_done: int = 0  # prompt tokens evaluated
    t_start: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.prompt = np.asarray(self.request.prompt, np.int32)

    @property
    def n_left(self) -> int:
        return len(self.prompt) - self.n_done

    def out_range(self, n: int) -> tuple[int, int]:
        """Which tokens of the next chunk of n tokens give output rows (chunk indices lo..hi-1)."""
        pooling = self.request.pooling
        if pooling == Pooling.CLS:
            return (0, 1) if self.n_done == 0 else (0, 0)
        if pooling in (Pooling.LAST, Pooling.RANK):  # rank pooling of a causal model reads the last token
            return (n - 1, n) if n == self.n_left else (0, 0)
        return 0, n

    def take(self, n: int, hidden: np.ndarray) -> None:
        """A chunk of n tokens ran; `hidden` holds its output rows (copied: the model may reuse it)."""
        if len(hidden):
            if self.rows is None:
                n_rows = len(self.prompt) if self.request.pooling in (Pooling.MEAN, Pooling.NONE) else 1
                self.rows = np.empty((n_rows, hidden.shape[1]), np.float32)
            at = self.n_done if len(self.rows) > 1 else 0
            self.rows[at : at + len(hidden)] = hidden
        self.n_done += n

    def result(self, head: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        """The pooled vector; rank pooling gives `head`'s scores of the last row (unnormalized)."""
        assert self.rows is not None and self.n_left == 0
        if self.request.pooling == Pooling.RANK:
            return head(self.rows[-1]) if head is not None else self.rows[-1].copy()
        return pool(self.rows, self.request.pooling, self.request.normalize)


def pool(h: np.ndarray, pooling: Pooling, norm: int) -> np.ndarray:
    """llama.cpp's pooling of hidden states h [n, n_embd] (for cls and last, h may be just that row)."""
    if pooling == Pooling.NONE:
        return np.stack([normalize(r, norm) for r in h])
    v = {Pooling.MEAN: h.mean(axis=0), Pooling.CLS: h[0], Pooling.LAST: h[-1]}[pooling]
    return normalize(v.astype(np.float32), norm)


def normalize(v: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize: -1 none, 0 max-abs (int16 range), 1 taxicab, 2 euclidean, p."""
    if norm < 0:
        return v
    if norm == 0:
        s = np.abs(v).max() / 32760.0
    elif norm == 2:
        s = np.sqrt(np.sum(v.astype(np.float64) ** 2))
    else:
        s = np.sum(np.abs(v.astype(np.float64)) ** norm) ** (1.0 / norm)
    return (v / s).astype(np.float32) if s > 0 else v
