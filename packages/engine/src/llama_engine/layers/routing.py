"""The MoE router's steps on the CPU, as ggml computes them: gating, expert selection, weights, and the
grouping of a batch's (token, expert) pairs by expert (ggml_mul_mat_id's row lists).

``route`` is llama.cpp's build_moe_ffn up to the weights: ``ggml_soft_max`` (or ``ggml_sigmoid``) of the
router logits, ``ggml_argsort_top_k`` (``std::sort`` of the expert indices, descending, then the first k),
``ggml_get_rows`` of the probabilities, optionally ``ggml_soft_max`` of those (SOFTMAX_WEIGHT), their
normalisation (``ggml_sum_rows``, ``ggml_clamp``, ``ggml_div``) and ``ggml_scale``. Ties in the
probabilities are ordered as libstdc++'s ``std::sort`` orders them (``stl_sort_desc``): an introsort whose
ranges of 16 or fewer end in an insertion sort, so with up to 16 experts equal values keep index order.
The plain-numpy references are in ``ref``.
"""

from __future__ import annotations

import math
from enum import IntEnum

import numba
import numpy as np
from numba import uint64

from ..ops.expf import expf_in_range, expf_main, expf_sse2

__all__ = [
    "WEIGHTS_SUM_MIN",
    "Gating",
    "group_by_expert",
    "route",
    "stl_sort_desc",
    "weighted_sum",
]

WEIGHTS_SUM_MIN = np.float32(6.103515625e-5)  # build_moe_ffn clamps the weights' sum to the least normal fp16
_THRESHOLD = 16  # libstdc++'s _S_threshold: ranges this short are left to the final insertion sort


class Gating(IntEnum):
    """llama.cpp's llama_expert_gating_func_type (``<arch>.expert_gating_func``)."""

    SOFTMAX = 1
    SIGMOID = 2
    SOFTMAX_WEIGHT = 3  # the router logits select; a softmax over the chosen ones weighs


# -- std::sort(v, v + n, [&](int a, int b) { return p[a] > p[b]; }), libstdc++'s algorithm -----------------


@numba.njit(cache=True, nogil=True, inline="always")
def _before(p, a, b):  # type: ignore[no-untyped-def]
    return p[a] > p[b]  # ggml's cmp_argsort<GGML_SORT_ORDER_DESC>


@numba.njit(cache=True, nogil=True)
def _insertion_sort(v, p, first, last):  # type: ignore[no-untyped-def]
    """__insertion_sort: stable for a strict comparison."""
    for i in range(first + 1, last):
        val = v[i]
        if _before(p, val, v[first]):
            for j in range(i, first, -1):
                v[j] = v[j - 1]
            v[first] = val
        else:
            _linear_insert(v, p, i)


@numba.njit(cache=True, nogil=True)
def _linear_insert(v, p, last):  # type: ignore[no-untyped-def]
    """__unguarded_linear_insert: a smaller element is known to lie before ``last``."""
    val = v[last]
    nxt = last - 1
    while _before(p, val, v[nxt]):
        v[last] = v[nxt]
        last = nxt
        nxt -= 1
    v[last] = val


@numba.njit(cache=True, nogil=True)
def _adjust_heap(v, p, first, hole, length, val):  # type: ignore[no-untyped-def]
    """__adjust_heap then __push_heap."""
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if _before(p, v[first + child], v[first + child - 1]):
            child -= 1
        v[first + hole] = v[first + child]
        hole = child
    if (length & 1) == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        v[first + hole] = v[first + child - 1]
        hole = child - 1
    while hole > top:
        parent = (hole - 1) // 2
        if not _before(p, v[first + parent], val):
            break
        v[first + hole] = v[first + parent]
        hole = parent
    v[first + hole] = val


@numba.njit(cache=True, nogil=True)
def _heap_sort(v, p, first, last):  # type: ignore[no-untyped-def]
    """__partial_sort(first, last, last): __make_heap, then __sort_heap."""
    length = last - first
    if length >= 2:
        parent = (length - 2) // 2
        while True:
            _adjust_heap(v, p, first, parent, length, v[first + parent])
            if parent == 0:
                break
            parent -= 1
    while last - first > 1:
        last -= 1
        val = v[last]
        v[last] = v[first]
        _adjust_heap(v, p, first, 0, last - first, val)


@numba.njit(cache=True, nogil=True)
def _median_to_first(v, p, result, a, b, c):  # type: ignore[no-untyped-def]
    """__move_median_to_first."""
    if _before(p, v[a], v[b]):
        if _before(p, v[b], v[c]):
            m = b
        elif _before(p, v[a], v[c]):
            m = c
        else:
            m = a
    elif _before(p, v[a], v[c]):
        m = a
    elif _before(p, v[b], v[c]):
        m = c
    else:
        m = b
    v[result], v[m] = v[m], v[result]


@numba.njit(cache=True, nogil=True)
def _partition(v, p, first, last):  # type: ignore[no-untyped-def]
    """__unguarded_partition_pivot: the median of three moved to ``first``, then Hoare's partition."""
    _median_to_first(v, p, first, first + 1, first + (last - first) // 2, last - 1)
    pivot = first
    first += 1
    while True:
        while _before(p, v[first], v[pivot]):
            first += 1
        last -= 1
        while _before(p, v[pivot], v[last]):
            last -= 1
        if not first < last:
            return first
        v[first], v[last] = v[last], v[first]
        first += 1


@numba.njit(cache=True, nogil=True)
def stl_sort_desc(v, p, n):  # type: ignore[no-untyped-def]
    """Sort the indices ``v[:n]`` by ``p[v[i]]``, largest first, as libstdc++'s ``std::sort`` does
    (ggml_argsort's order, ties included). The recursion on the upper part is an explicit stack: the
    ranges are disjoint, so the order they are sorted in does not change the result."""
    if n < 2:
        return
    depth = 0
    m = n
    while m > 1:  # std::__lg(n) * 2
        m >>= 1
        depth += 1
    depth *= 2
    stack = np.empty((depth + 2, 3), np.int64)
    top = 0
    first, last = 0, n
    while True:
        while last - first > _THRESHOLD:
            if depth == 0:
                _heap_sort(v, p, first, last)
                break
            depth -= 1
            cut = _partition(v, p, first, last)
            stack[top, 0], stack[top, 1], stack[top, 2] = cut, last, depth
            top += 1
            last = cut
        if top == 0:
            break
        top -= 1
        first, last, depth = stack[top, 0], stack[top, 1], stack[top, 2]
    if n > _THRESHOLD:  # __final_insertion_sort
        _insertion_sort(v, p, 0, _THRESHOLD)
        for i in range(_THRESHOLD, n):
            _linear_insert(v, p, i)
    else:
        _insertion_sort(v, p, 0, n)


# -- gating, selection, weights ------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _soft_max(y, x, n):  # type: ignore[no-untyped-def]
    """y[:n] = ggml_soft_max(x[:n]) with ggml_vec_soft_max_f32's SSE2 form: ggml_v_expf four at a time,
    each group summed (v0 + v1) + (v2 + v3) in float, then in double; the tail with the C library's expf;
    times 1 / sum rounded to float."""
    mx = np.float32(-np.inf)
    for j in range(n):
        if x[j] > mx:
            mx = x[j]
    simd = uint64(n - n % 4)
    if expf_in_range(x, simd, mx):
        for j in range(simd):
            y[j] = expf_main(x[j] - mx)
    else:
        for j in range(simd):
            y[j] = expf_sse2(x[j] - mx)
    total = 0.0
    for g in range(0, simd, 4):
        total += np.float64((y[g] + y[g + 1]) + (y[g + 2] + y[g + 3]))
    for j in range(simd, uint64(n)):
        y[j] = np.float32(math.exp(np.float64(x[j] - mx)))
        total += np.float64(y[j])
    inv = np.float32(1.0 / total)
    for j in range(n):
        y[j] = y[j] * inv


@numba.njit(cache=True, nogil=True)
def route(logits, probs, order, selected, weights, n, n_expert, k, gating, norm, scale):  # type: ignore[no-untyped-def]
    """Per token t < n: probs[t] = gating(logits[t]) ([n_expert]), order[t] the experts sorted by it
    (largest first), selected[t] = the first k, weights[t] their probabilities, after the SOFTMAX_WEIGHT
    softmax, the normalisation (``norm``: divided by their sum clamped to ``WEIGHTS_SUM_MIN``) and the scale
    (``scale`` other than 0 and 1)."""
    one = np.float32(1.0)
    for t in range(n):
        x, p, v, w = logits[t], probs[t], order[t], weights[t]
        if gating == 1:
            _soft_max(p, x, n_expert)
        elif gating == 2:  # ggml_vec_sigmoid_f32
            for j in range(n_expert):
                p[j] = one / (one + np.float32(math.exp(-np.float64(x[j]))))
        else:
            for j in range(n_expert):
                p[j] = x[j]
        for j in range(n_expert):
            v[j] = j
        stl_sort_desc(v, p, n_expert)
        for i in range(k):
            selected[t, i] = v[i]
            w[i] = p[v[i]]
        if gating == 3:
            _soft_max(w, w, k)
        if norm:
            acc = 0.0  # ggml_vec_sum_f32: a double sum, rounded to float
            for i in range(k):
                acc += np.float64(w[i])
            s = max(min(np.float32(acc), np.float32(np.inf)), WEIGHTS_SUM_MIN)
            for i in range(k):
                w[i] = w[i] / s
        if scale != 0.0 and scale != 1.0:
            sc = np.float32(scale)
            for i in range(k):
                w[i] = w[i] * sc


# -- mul_mat_id's grouping and the weighted sum ------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def group_by_expert(selected, n, k, n_expert, offsets, pairs, active):  # type: ignore[no-untyped-def]
    """Group the pairs (token t, slot i) by expert, tokens in order: expert e's pairs are
    ``pairs[offsets[e]:offsets[e + 1]]`` (each ``t * k + i``); ``active[:m]`` lists the experts with any,
    ascending; returns m."""
    for e in range(n_expert + 1):
        offsets[e] = 0
    for t in range(n):
        for i in range(k):
            offsets[selected[t, i] + 1] += 1
    m = 0
    for e in range(n_expert):
        if offsets[e + 1]:
            active[m] = e
            m += 1
        offsets[e + 1] += offsets[e]
    for t in range(n):  # the offsets advance as they fill, then are shifted back by one expert
        for i in range(k):
            e = selected[t, i]
            pairs[offsets[e]] = t * k + i
            offsets[e] += 1
    for e in range(n_expert, 0, -1):
        offsets[e] = offsets[e - 1]
    offsets[0] = 0
    return m


@numba.njit(cache=True, nogil=True)
def weighted_sum(out, experts, weights, n, k, d):  # type: ignore[no-untyped-def]
    """out[t] = ((e_0 w_0 + e_1 w_1) + e_2 w_2) + ... with e_i = experts[t * k + i]: ggml_mul by the
    weights, then the views added in slot order (build_moe_ffn's aggregation)."""
    for t in range(n):
        o = out[t]
        e0 = experts[t * k]
        w0 = weights[t, 0]
        for c in range(d):
            o[c] = e0[c] * w0
        for i in range(1, k):
            e = experts[t * k + i]
            w = weights[t, i]
            for c in range(d):
                o[c] = o[c] + e[c] * w
