# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""The steps the grid i-quant quantizers share (ggml-quants.c, quantize_row_iq2_xxs_impl and its siblings):
importance weights of a block, even-parity sign folding, rounding a group to grid levels, looking the group
up in the grid tables (llama_quant.formats.iq_grid_init) and the nearest-neighbour search off the grid.

Every step computes in float32 in the C loop's order (see llama_quant.formats.common).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llama_quant.formats.common import nearest_int

__all__ = [
    "FLT_MAX",
    "best_neighbour",
    "block_weights",
    "even_signs",
    "group_index",
    "max_of",
    "round_levels",
    "scale_code",
    "snap_group",
    "weighted_sums",
]

_f = np.float32
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
FLT_MAX = np.float32(3.4028234663852886e38)


@njit(cache=True, inline="always", error_model="numpy")
def max_of(v, n):
    """MAX over v[:n] in C's order (``m = m > v ? m : v``)."""
    m = v[0]
    for i in range(1, n):
        m = m if m > v[i] else v[i]
    return m


@njit(cache=True, inline="always", error_model="numpy")
def scale_code(idd, s, top):
    """A block scale as a code in [0, top]: nearest_int(0.5f*(id*scale - 1)), clamped."""
    return max(0, min(top, nearest_int(_HALF * (idd * s - _ONE))))


@njit(cache=True, inline="always", error_model="numpy")
def block_weights(xb, qw, q0, use_qw, sigma2, floor, weight, waux, n):
    """weight[i] = qw[q0 + i] * sqrtf(sigma2 + x*x), without importance weights floor + x*x (IQ2_S's
    0.25f*sigma2; 0 for the others, which leaves x*x exact); waux = sqrtf(weight)."""
    for i in range(n):
        weight[i] = qw[q0 + i] * np.sqrt(sigma2 + xb[i] * xb[i]) if use_qw else floor + xb[i] * xb[i]
    for i in range(n):
        waux[i] = np.sqrt(weight[i])


@njit(cache=True, inline="always", error_model="numpy")
def even_signs(xb, weight, xval, b, parity):
    """xval[b:b+8] = |xb[b:b+8]|; returns the sign bits. With ``parity`` an odd count of negatives flips the
    least important weight back (ggml's even-parity sign groups) and the result keeps 7 bits."""
    s = 0
    nflip = 0
    for i in range(8):
        v = xb[b + i]
        if v >= _ZERO:
            xval[b + i] = v
        else:
            xval[b + i] = -v
            nflip += 1
            s |= 1 << i
    if not parity:
        return s
    if nflip % 2:
        imin = 0
        vmin = weight[b] * xb[b] * xb[b]
        for i in range(1, 8):
            ax = weight[b + i] * xb[b + i] * xb[b + i]
            if ax < vmin:
                vmin = ax
                imin = i
        xval[b + imin] = -xval[b + imin]
        s ^= 1 << imin
    return s & 127


@njit(cache=True, inline="always", error_model="numpy")
def round_levels(xval, idv, L, b, dim, kmax):
    """L[b:b+dim] = clamp(nearest_int(0.5f*(id*x - 1)), 0, kmax)."""
    for i in range(dim):
        lv = nearest_int(_HALF * (idv * xval[b + i] - _ONE))
        L[b + i] = max(0, min(kmax, lv))


@njit(cache=True, inline="always", error_model="numpy")
def group_index(L, b, dim, bits):
    """The packed level index sum(L[b+i] << bits*i) of one group."""
    u = 0
    for i in range(dim):
        u |= np.int64(L[b + i]) << (bits * i)
    return u


@njit(cache=True, error_model="numpy")
def best_neighbour(neighbours, off, grid, xval, waux, scale, L, b):
    """iq2/iq3_find_best_neighbour: the listed entry nearest to xval[b:] under waux; writes its levels."""
    dim = grid.shape[1]
    n = np.int64(neighbours[off])
    best_d2 = FLT_MAX
    gi = -1
    for j in range(1, n + 1):
        e = np.int64(neighbours[off + j])
        d2 = _ZERO
        for i in range(dim):
            diff = scale * _f(grid[e, i]) - xval[b + i]
            d2 += waux[b + i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            gi = e
    if gi < 0:  # only NaN distances (ggml asserts here); keep the first listed entry
        gi = np.int64(neighbours[off + 1])
    for i in range(dim):
        L[b + i] = (np.int64(grid[gi, i]) - 1) // 2
    return gi


@njit(cache=True, inline="always", error_model="numpy")
def snap_group(tables_grid, kmap, neighbours, xval, waux, scale, L, b, bits):
    """Move the levels L[b:b+dim] onto the grid (the group itself, else its best neighbour at ``scale``);
    returns (grid entry, whether the rounded group was on the grid)."""
    dim = tables_grid.shape[1]
    u = group_index(L, b, dim, bits)
    gi = np.int64(kmap[u])
    if gi >= 0:
        return gi, True
    return best_neighbour(neighbours, -gi - 1, tables_grid, xval, waux, scale, L, b), False


@njit(cache=True, inline="always", error_model="numpy")
def weighted_sums(weight, xval, L, n):
    """sum(w*x*q), sum(w*q*q) with q = 2*L+1, in order."""
    sumqx = _ZERO
    sumq2 = _ZERO
    for i in range(n):
        w = weight[i]
        q = _f(2 * np.int64(L[i]) + 1)
        sumqx += w * xval[i] * q
        sumq2 += w * q * q
    return sumqx, sumq2
