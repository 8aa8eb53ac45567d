"""The attention's two products for one KV head and token block, in register tiles (``tiles``).

K.Q: w[a, j] = (q_a . k_j) * sc; KQV: kqv[a, d] = sum over the cells, in order, of p_aj * v_jd. Many lanes
(a prompt's tokens times query heads) are the vector lanes, so each K and V row is read once for all of
them; few lanes (decoding) put the cells (K.Q) or the dimensions (KQV) on the vector lanes instead. Every
sum runs over the same operands in the same order either way.

Each product is its own compiled function, and the element type it works in follows the cache layer's type
when it is compiled (``product_zeros``): float64 holding f16 values for an f16 cache (each product exact),
float32 for an f32 cache. So a model compiles only the bodies its cache type runs, and each body is
optimized on its own, not inlined into one large kernel.

The inner loops index row views with unsigned counters: a signed index makes numba check for negative
(wrap-around) indices, and that keeps LLVM from vectorizing the loop.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types, uint64
from numba.extending import overload

from ._intrinsics import as_cache, widen
from .tiles import TILE_COLS, TILE_LANES, tile_sums, tile_sums8

__all__ = ["CELL_CHUNK", "kq_few", "kq_many", "kqv_few", "kqv_many", "product_zeros", "round_up"]

CELL_CHUNK = 128  # cells whose K or V rows are widened at a time (a multiple of both tile widths)


def product_zeros(shape, cache):  # type: ignore[no-untyped-def]
    """Zeroed scratch of the element type the products over the cache layer ``cache`` are taken in: float64
    for an f16 cache (f16 values multiply exactly in double, as ggml's float product widened), float32 for
    an f32 cache (each product rounded to float, then summed in double, as ggml's generic vec_dot).
    Compiled code only (the overload below)."""
    raise NotImplementedError


@overload(product_zeros)
def _product_zeros(shape, cache):  # type: ignore[no-untyped-def]
    wide = np.float64 if cache.dtype == types.uint16 else np.float32
    return lambda shape, cache: np.zeros(shape, wide)


@numba.njit(cache=True, nogil=True, inline="always")
def _widen_rows(dst, src, cells, first, m, ko, head_dim):  # type: ignore[no-untyped-def]
    """dst[j, 0:head_dim] = the cache row of cell cells[first + j] from column ko on, widened, for j < m."""
    for j in range(m):
        row = src[cells[first + j], ko : ko + head_dim]
        for d in range(uint64(head_dim)):
            dst[j, d] = widen(row[d])  # type: ignore[call-arg]


@numba.njit(cache=True, nogil=True)
def kq_many(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc, cols):  # type: ignore[no-untyped-def]
    """w[a, j] = (q_a . k_j) * sc for all lanes (qt: [head_dim, lanes]) and the span's cells, in register
    tiles ``cols`` wide (``tile_sums``, ``tile_sums8``)."""
    nl = round_up(lanes, TILE_LANES)
    qa = product_zeros((head_dim, nl), k)
    kb = product_zeros((CELL_CHUNK, head_dim), k)
    _copy_lanes(qa, qt, head_dim, lanes)
    res = np.empty((CELL_CHUNK, nl), np.float64)
    for c0 in range(0, span, CELL_CHUNK):
        m = min(CELL_CHUNK, span - c0)
        _widen_rows(kb, k, cells, jlo + c0, m, ko, head_dim)
        res[:] = 0.0
        for j0 in range(0, m, cols):
            for a0 in range(0, nl, TILE_LANES):
                if cols == 8:
                    tile_sums8(res, j0 * nl + a0, qa, a0, kb, j0 * head_dim, head_dim, nl, 1, head_dim, nl)  # type: ignore[call-arg]
                else:
                    tile_sums(res, j0 * nl + a0, qa, a0, kb, j0 * head_dim, head_dim, nl, 1, head_dim, nl)  # type: ignore[call-arg]
        for a in range(lanes):
            for j in range(m):
                w[a, c0 + j] = np.float32(res[j, a]) * sc


@numba.njit(cache=True, nogil=True, inline="always")
def _copy_lanes(dst, qt, head_dim, lanes):  # type: ignore[no-untyped-def]
    """dst[:, :lanes] = qt, element by element: an array slice assignment would compile numba's shape
    mismatch error message (string formatting), which costs more to compile than the products."""
    for d in range(head_dim):
        for a in range(lanes):
            dst[d, a] = qt[d, a]


@numba.njit(cache=True, nogil=True, inline="always")
def round_up(n, m):  # type: ignore[no-untyped-def]
    return (n + m - 1) // m * m


@numba.njit(cache=True, nogil=True)
def kq_few(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc):  # type: ignore[no-untyped-def]
    """w[a, j] = (q_a . k_j) * sc for few lanes: the cells are the register tile's lanes (``tile_sums``, 8
    cells by 4 query lanes), each K row widened once into a [head_dim, 8] block."""
    qc = product_zeros((head_dim, round_up(lanes, TILE_COLS)), k)
    kt = product_zeros((head_dim, TILE_LANES), k)
    ncol = qc.shape[1]
    _copy_lanes(qc, qt, head_dim, lanes)
    res = np.empty(TILE_LANES * ncol, np.float64)
    for j0 in range(0, span, TILE_LANES):
        m = min(TILE_LANES, span - j0)
        for i in range(m):  # a last block's stale columns only feed sums that are not read
            krow = k[cells[jlo + j0 + i], ko : ko + head_dim]
            for d in range(uint64(head_dim)):
                kt[d, i] = widen(krow[d])  # type: ignore[call-arg]
        res[:] = 0.0
        for c0 in range(0, ncol, TILE_COLS):
            tile_sums(res, c0 * TILE_LANES, kt, 0, qc, c0, head_dim, TILE_LANES, ncol, 1, TILE_LANES)  # type: ignore[call-arg]
        for a in range(lanes):
            for i in range(m):
                w[a, j0 + i] = np.float32(res[a * TILE_LANES + i]) * sc


@numba.njit(cache=True, nogil=True)
def kqv_many(w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes, cols):  # type: ignore[no-untyped-def]
    """kqv [lanes, head_dim] float64: kqv[a, d] = sum over the span's cells, in order, of p_aj * v_jd
    (``tile_sums``, ``cols`` wide), with the probabilities zero outside each lane's cells (adding a zero
    product leaves a sum unchanged)."""
    nl = round_up(lanes, TILE_LANES)
    pm = product_zeros((span, nl), v)
    vb = product_zeros((CELL_CHUNK, head_dim), v)
    for a in range(lanes):
        t = t0 + a // group
        for j in range(lo[t] - jlo, hi[t] - jlo):
            pm[j, a] = _prob(w[a, j], inv[a], v)
    kqvt = np.zeros((head_dim, nl), np.float64)
    for c0 in range(0, span, CELL_CHUNK):
        m = min(CELL_CHUNK, span - c0)
        _widen_rows(vb, v, cells, jlo + c0, m, ko, head_dim)
        for d0 in range(0, head_dim, cols):
            for a0 in range(0, nl, TILE_LANES):
                if cols == 8:
                    tile_sums8(kqvt, d0 * nl + a0, pm, c0 * nl + a0, vb, d0, m, nl, head_dim, 1, nl)  # type: ignore[call-arg]
                else:
                    tile_sums(kqvt, d0 * nl + a0, pm, c0 * nl + a0, vb, d0, m, nl, head_dim, 1, nl)  # type: ignore[call-arg]
    kqv = np.zeros((lanes, head_dim), np.float64)
    for a in range(lanes):
        for d in range(head_dim):
            kqv[a, d] = kqvt[d, a]
    return kqv


@numba.njit(cache=True, nogil=True)
def kqv_few(w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes):  # type: ignore[no-untyped-def]
    """kqv [lanes rounded up to 4, head_dim rounded up to 8] float64: kqv[a, d] = sum over the span's cells,
    in order, of p_aj * v_jd for few lanes: the dimensions are the register tile's lanes (``tile_sums``, 8
    dimensions by 4 query lanes), with the probabilities zero outside each lane's cells."""
    ncol, hd8 = round_up(lanes, TILE_COLS), round_up(head_dim, TILE_LANES)
    pm = product_zeros((CELL_CHUNK, ncol), v)
    vb = product_zeros((CELL_CHUNK, hd8), v)
    kqv = np.zeros((ncol, hd8), np.float64)
    for c0 in range(0, span, CELL_CHUNK):
        m = min(CELL_CHUNK, span - c0)
        _widen_rows(vb, v, cells, jlo + c0, m, ko, head_dim)
        for j in range(m):
            for a in range(lanes):
                t = t0 + a // group
                jj = c0 + j
                inside = lo[t] - jlo <= jj < hi[t] - jlo
                pm[j, a] = _prob(w[a, jj], inv[a], v) if inside else 0.0
        for d0 in range(0, hd8, TILE_LANES):
            for a0 in range(0, ncol, TILE_COLS):
                tile_sums(kqv, a0 * hd8 + d0, vb, d0, pm, a0, m, hd8, ncol, 1, hd8)  # type: ignore[call-arg]
    return kqv


@numba.njit(cache=True, nogil=True, inline="always")
def _prob(e, inv, v):  # type: ignore[no-untyped-def]
    """A softmax output as mul_mat(v, kq) reads it: e * (1 / sum), rounded to f16 for an f16 V cache."""
    return as_cache(e * inv, v)
