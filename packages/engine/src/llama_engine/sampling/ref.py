"""Plain-numpy references of the sampling kernels (same signatures as ``kernels``), for tests.

Readable rather than fast: whole-array numpy where the kernel loops. Float32 running sums use
``np.cumsum`` (sequential, like the kernels and llama.cpp), never ``np.sum`` (pairwise).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "argsort_desc",
    "logit_bias",
    "min_p",
    "penalties",
    "softmax",
    "temp",
    "top_k",
    "top_n_sigma",
    "top_p",
]


def argsort_desc(logits: np.ndarray, n: int) -> np.ndarray:
    """Positions of logits[:n], largest first, ties in position order."""
    return np.argsort(-logits[:n], kind="stable")


def _gather_front(ids, logits, probs, n, order, m) -> None:
    sel = order[:m]
    ids[:m], logits[:m], probs[:m] = ids[:n][sel], logits[:n][sel], probs[:n][sel]


def _fsum(x: np.ndarray) -> np.float32:
    return np.cumsum(x, dtype=np.float32)[-1] if x.size else np.float32(0)


def softmax(ids, logits, probs, n, is_sorted, do_sort) -> bool:
    if do_sort and not is_sorted:
        _gather_front(ids, logits, probs, n, argsort_desc(logits, n), n)
        is_sorted = True
    max_l = logits[0] if is_sorted else logits[:n].max()
    e = np.exp(logits[:n] - max_l)
    probs[:n] = e / _fsum(e)
    return is_sorted


def top_k(ids, logits, probs, n, is_sorted, k) -> int:
    if k <= 0:
        return n
    k = min(k, n)
    if not is_sorted:
        _gather_front(ids, logits, probs, n, argsort_desc(logits, n), k)
    return k


def top_p(ids, logits, probs, n, is_sorted, p, min_keep) -> int:
    softmax(ids, logits, probs, n, is_sorted, False)
    if not is_sorted:
        _gather_front(ids, logits, probs, n, argsort_desc(logits, n), n)
    cum = np.cumsum(probs[:n], dtype=np.float32)
    ok = np.flatnonzero((cum >= p) & (np.arange(1, n + 1) >= min_keep))
    return int(ok[0]) + 1 if ok.size else n


def min_p(ids, logits, probs, n, is_sorted, p, min_keep) -> tuple[int, bool]:
    if n == 0:
        return n, is_sorted
    log_p = np.float32(np.log(np.float64(p)))
    if not is_sorted:
        keep = np.flatnonzero(logits[:n] >= logits[:n].max() + log_p)
        if keep.size and keep.size >= min_keep:
            _gather_front(ids, logits, probs, n, keep, keep.size)
            return keep.size, is_sorted
        _gather_front(ids, logits, probs, n, argsort_desc(logits, n), n)
        is_sorted = True
    cut = logits[0] + log_p
    drop = np.flatnonzero((logits[1:n] < cut) & (np.arange(1, n) >= min_keep))
    return (int(drop[0]) + 1 if drop.size else n), is_sorted


def temp(logits, n, t) -> None:
    if n == 0:
        return
    if t <= 0:
        i = int(np.argmax(logits[:n]))
        v = logits[i]
        logits[:n] = -np.inf
        logits[i] = v
        return
    logits[:n] = logits[:n] / np.float32(t)


def top_n_sigma(logits, n, nsig) -> None:
    if n <= 1:
        return
    x = logits[:n]
    valid = x[x != -np.inf]
    if valid.size == 0:
        return
    mean = _fsum(valid) / np.float32(valid.size)
    d = (valid - mean).astype(np.float64)
    acc = np.float32(0)
    for sq in d * d:  # float32 accumulator of double squares, as llama.cpp
        acc = np.float32(np.float64(acc) + sq)
    std = np.float32(np.sqrt(acc / np.float32(valid.size)))
    x[x < valid.max() - np.float32(nsig) * std] = -np.inf


def penalties(ids, logits, n, counts, repeat, freq, present) -> None:
    c = counts[ids[:n]]
    hit = c > 0
    v = logits[:n][hit]
    v = np.where(v <= 0, v * np.float32(repeat), v / np.float32(repeat))
    logits[:n][hit] = v - (c[hit].astype(np.float32) * np.float32(freq) + np.float32(present))


def logit_bias(ids, logits, n, tokens, biases) -> None:
    # unshuffled entries (ids[t] == t) get every bias; the others only their first one, as llama.cpp
    search: dict[int, np.float32] = {}
    for t, b in zip(tokens.tolist(), biases, strict=True):
        if 0 <= t < n and ids[t] == t:
            logits[t] += b
        else:
            search.setdefault(t, b)
    for t, b in search.items():
        logits[:n][ids[:n] == t] += b
