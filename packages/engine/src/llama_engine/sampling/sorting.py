"""Candidate ordering for the sampling kernels: llama.cpp's (partial) sorts by logit.

``std::partial_sort`` and the bucket sort of llama-sampler.cpp leave equal logits in an
unspecified order; these sorts are stable (equal logits keep their current order), so results
are deterministic and match llama.cpp whenever logits are distinct.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["argsort_desc", "gather_front", "sort_prefix", "top_positions"]


@njit(cache=True, nogil=True)
def argsort_desc(logits, n):
    """Stable argsort of logits[:n], largest first: LSD radix sort (11/11/10 bits) on order keys."""
    bits = logits[:n].view(np.uint32)
    keys = np.empty(n, dtype=np.uint32)
    for i in range(n):
        b = bits[i]
        # ascending float order as unsigned order, then inverted for descending
        asc = ~b if b & np.uint32(0x80000000) else b | np.uint32(0x80000000)
        keys[i] = ~asc
    idx = np.arange(n).astype(np.int32)
    keys2 = np.empty(n, dtype=np.uint32)
    idx2 = np.empty(n, dtype=np.int32)
    counts = np.empty(2049, dtype=np.int64)
    for shift, mask in ((0, 0x7FF), (11, 0x7FF), (22, 0x3FF)):
        counts[:] = 0
        sh = np.uint32(shift)
        mk = np.uint32(mask)
        for i in range(n):
            counts[((keys[i] >> sh) & mk) + 1] += 1
        for d in range(1, 2049):
            counts[d] += counts[d - 1]
        for i in range(n):
            d = (keys[i] >> sh) & mk
            j = counts[d]
            keys2[j] = keys[i]
            idx2[j] = idx[i]
            counts[d] = j + 1
        keys, keys2 = keys2, keys
        idx, idx2 = idx2, idx
    return idx.astype(np.int64)


_RUN = 64  # logits per run checked against the heap's root at once


@njit(cache=True, nogil=True)
def top_positions(logits, n, k):
    """Positions of the k largest logits of [0, n), best first; ties keep the earlier position."""
    if k * 16 >= n:
        # a large share of the array: one stable sort is cheaper than a heap
        return argsort_desc(logits, n)[:k]
    # min-heap of the k best seen so far; the root is the worst kept (lowest logit, latest position)
    hv = np.empty(k, dtype=np.float32)
    hi = np.empty(k, dtype=np.int64)
    m = 0
    for i in range(0, n, _RUN):
        end = min(i + _RUN, n)
        if m == k:
            # a full heap rejects every v <= its root: a run with none better is skipped whole (counted,
            # so the loop vectorizes; NaN, never > the root, is skipped as in the loop below)
            root = hv[0]
            better = 0
            for j in range(i, end):
                better += logits[j] > root
            if better == 0:
                continue
        for pos in range(i, end):
            v = logits[pos]
            if m < k:
                j = m
                m += 1
                while j > 0:
                    parent = (j - 1) >> 1
                    if hv[parent] < v or (hv[parent] == v and hi[parent] < pos):
                        break
                    hv[j] = hv[parent]
                    hi[j] = hi[parent]
                    j = parent
                hv[j] = v
                hi[j] = pos
            elif v > hv[0]:
                j = 0
                while True:
                    c = 2 * j + 1
                    if c >= k:
                        break
                    # pick the worse child
                    if c + 1 < k and (hv[c + 1] < hv[c] or (hv[c + 1] == hv[c] and hi[c + 1] > hi[c])):
                        c += 1
                    if v < hv[c] or (v == hv[c] and pos > hi[c]):
                        break
                    hv[j] = hv[c]
                    hi[j] = hi[c]
                    j = c
                hv[j] = v
                hi[j] = pos
    by_pos = np.argsort(hi[:m], kind="mergesort")
    kept = hi[:m][by_pos]
    vals = hv[:m][by_pos]
    return kept[np.argsort(-vals, kind="mergesort")]


@njit(cache=True, nogil=True)
def gather_front(ids, logits, probs, n, order, m):
    """Candidates order[:m] (positions into [0, n)) become [0, m), in that order."""
    sel = order[:m]
    t_ids = ids[:n][sel]
    t_logits = logits[:n][sel]
    t_probs = probs[:n][sel]
    ids[:m] = t_ids
    logits[:m] = t_logits
    probs[:m] = t_probs


@njit(cache=True, nogil=True)
def sort_prefix(ids, logits, probs, n, k):
    """Move the k best candidates of [0, n) to [0, k), sorted by logit descending; [k, n) is
    left undefined (the caller truncates). ``llama_token_data_array_partial_sort_inplace``.
    """
    if n == 0 or k == 0:
        return
    gather_front(ids, logits, probs, n, top_positions(logits, n, k), k)
