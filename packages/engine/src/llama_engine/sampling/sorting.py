"""Candidate ordering for the sampling kernels: llama.cpp's (partial) sorts by logit.

``std::partial_sort`` and the bucket sort of llama-sampler.cpp leave equal logits in an
unspecified order; these sorts are stable (equal logits keep their current order), so results
are deterministic and match llama.cpp whenever logits are distinct.

Every sort here is written out in plain loops: numba's ``np.argsort(kind="mergesort")`` is a recursive
function, and fancy indexing or array slice assignment compiles numba's shape-error message (string
formatting); either costs more to compile than the sampler around it, in every kernel that calls it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["argsort_asc", "argsort_desc", "gather_front", "sort_prefix", "top_positions"]


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
    return _radix_argsort(keys, n)


@njit(cache=True, nogil=True)
def argsort_asc(x, n):
    """``np.argsort(x[:n], kind="stable")`` of float32 x: ascending, -0.0 equal to 0.0, NaNs last."""
    return _radix_argsort(_asc_keys(x, n), n)


_NAN_KEY = np.uint32(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _asc_keys(x, n):
    """float32 x[:n] as uint32 keys in numpy's sort order: -0.0 and 0.0 one key, every NaN the largest."""
    bits = (x[:n] + np.float32(0.0)).view(np.uint32)  # + 0.0 turns -0.0 into 0.0
    keys = np.empty(n, dtype=np.uint32)
    for i in range(n):
        b = bits[i]
        keys[i] = (
            _NAN_KEY if x[i] != x[i] else (~b if b & np.uint32(0x80000000) else b | np.uint32(0x80000000))
        )
    return keys


@njit(cache=True, nogil=True)
def _radix_argsort(keys, n):
    """Stable argsort of keys[:n] (uint32, ascending; keys is overwritten): LSD radix sort, 11/11/10 bits."""
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
    return _best_first(hv[:m], hi[:m])


@njit(cache=True, nogil=True)
def _best_first(hv, hi):
    """The positions hi ordered by their logits hv, largest first, NaNs last, equal logits (-0.0
    and 0.0 too) by position: what a stable sort by position and then a stable sort of -hv give. Each
    (logit key, position) pair is distinct, so one sort of the packed pairs gives that order."""
    m = len(hv)
    keys = _asc_keys(hv, m)
    pairs = np.empty(m, dtype=np.uint64)
    for i in range(m):
        desc = _NAN_KEY if hv[i] != hv[i] else ~keys[i]
        pairs[i] = (np.uint64(desc) << np.uint64(32)) | np.uint64(hi[i])
    _heapsort(pairs)
    out = np.empty(m, dtype=np.int64)
    for i in range(m):
        out[i] = np.int64(pairs[i] & np.uint64(0xFFFFFFFF))
    return out


@njit(cache=True, nogil=True)
def _heapsort(a):  # type: ignore[no-untyped-def]
    """Sort a (uint64) ascending, in place."""
    n = len(a)
    for start in range(n // 2 - 1, -1, -1):
        _sift_down(a, start, n)
    for end in range(n - 1, 0, -1):
        a[0], a[end] = a[end], a[0]
        _sift_down(a, 0, end)


@njit(cache=True, nogil=True, inline="always")
def _sift_down(a, j, n):  # type: ignore[no-untyped-def]
    v = a[j]
    while True:
        c = 2 * j + 1
        if c >= n:
            break
        if c + 1 < n and a[c + 1] > a[c]:
            c += 1
        if a[c] <= v:
            break
        a[j] = a[c]
        j = c
    a[j] = v


@njit(cache=True, nogil=True)
def gather_front(ids, logits, probs, n, order, m):
    """Candidates order[:m] (positions into [0, n)) become [0, m), in that order."""
    t_ids = np.empty(m, dtype=ids.dtype)
    t_logits = np.empty(m, dtype=logits.dtype)
    t_probs = np.empty(m, dtype=probs.dtype)
    for i in range(m):
        j = order[i]
        t_ids[i] = ids[j]
        t_logits[i] = logits[j]
        t_probs[i] = probs[j]
    for i in range(m):
        ids[i] = t_ids[i]
        logits[i] = t_logits[i]
        probs[i] = t_probs[i]


@njit(cache=True, nogil=True)
def sort_prefix(ids, logits, probs, n, k):
    """Move the k best candidates of [0, n) to [0, k), sorted by logit descending; [k, n) is
    left undefined (the caller truncates). ``llama_token_data_array_partial_sort_inplace``.
    """
    if n == 0 or k == 0:
        return
    gather_front(ids, logits, probs, n, top_positions(logits, n, k), k)
