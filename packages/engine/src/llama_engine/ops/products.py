"""The attention's two products for one KV head and token block, in register tiles (``tiles``).

K.Q: w[a, j] = (q_a . k_j) * sc; KQV: kqv[a, d] = sum over the cells, in order, of p_aj * v_jd. Many lanes
(a prompt's tokens times query heads) are the vector lanes, so each K and V row is read once for all of
them; few lanes (decoding) put the cells (K.Q) or the dimensions (KQV) on the vector lanes instead. Every
sum runs over the same operands in the same order either way.

The inner loops index row views with unsigned counters: a signed index makes numba check for negative
(wrap-around) indices, and that keeps LLVM from vectorizing the loop.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import uint64

from ._intrinsics import round_f16, widen
from .tiles import TILE_COLS, TILE_LANES, tile_sums, tile_sums8

__all__ = ["CELL_CHUNK", "few_scratch", "kq_few", "kq_many", "kqv_few", "kqv_many", "round_up"]

CELL_CHUNK = 128  # cells whose K or V rows are widened at a time (a multiple of both tile widths)


@numba.njit(cache=True, nogil=True, inline="always")
def _widen_rows(dst, src, cells, first, m, ko, head_dim):  # type: ignore[no-untyped-def]
    """dst[j, 0:head_dim] = the cache row of cell cells[first + j] from column ko on, widened, for j < m."""
    for j in range(m):
        row = src[cells[first + j], ko : ko + head_dim]
        for d in range(uint64(head_dim)):
            dst[j, d] = widen(row[d])  # type: ignore[call-arg]


@numba.njit(cache=True, nogil=True, inline="always")
def kq_many(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc, qa, kb, cols):  # type: ignore[no-untyped-def]
    """w[a, j] = (q_a . k_j) * sc for all lanes and the span's cells, in register tiles (``tile_sums``).
    qa, kb: zeroed scratch [head_dim, padded lanes] and [CELL_CHUNK, head_dim] of the element type the
    products are taken in (``_tile_scratch``)."""
    nl = qa.shape[1]
    qa[:, :lanes] = qt
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
def round_up(n, m):  # type: ignore[no-untyped-def]
    return (n + m - 1) // m * m


@numba.njit(cache=True, nogil=True, inline="always")
def few_scratch(head_dim, lanes, dtype, cells=0):  # type: ignore[no-untyped-def]
    """Zeroed scratch of the element type the few-lane products are taken in: (query lanes [head_dim,
    lanes rounded up to 4], K block [head_dim, 8]) for ``kq_few``; with ``cells``, (probabilities
    [cells, lanes rounded up to 4], V rows [cells, head_dim rounded up to 8]) for ``kqv_few``."""
    if cells:
        return np.zeros((cells, round_up(lanes, TILE_COLS)), dtype), np.zeros(
            (cells, round_up(head_dim, TILE_LANES)), dtype
        )
    return np.zeros((head_dim, round_up(lanes, TILE_COLS)), dtype), np.zeros((head_dim, TILE_LANES), dtype)


@numba.njit(cache=True, nogil=True, inline="always")
def kq_few(w, qt, k, cells, jlo, span, ko, head_dim, lanes, sc, qc, kt):  # type: ignore[no-untyped-def]
    """w[a, j] = (q_a . k_j) * sc for few lanes: the cells are the register tile's lanes (``tile_sums``, 8
    cells by 4 query lanes), each K row widened once into a [head_dim, 8] block. qc, kt: ``few_scratch``."""
    ncol = qc.shape[1]
    qc[:, :lanes] = qt
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


@numba.njit(cache=True, nogil=True, inline="always")
def kqv_many(kqv, w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes, p16, pm, vb, cols):  # type: ignore[no-untyped-def]
    """kqv[a, d] = sum over the span's cells, in order, of p_aj * v_jd (``tile_sums``), with the
    probabilities zero outside each lane's cells (adding a zero product leaves a sum unchanged).
    pm, vb: zeroed scratch [span, padded lanes] and [CELL_CHUNK, head_dim] (``_tile_scratch``)."""
    nl = pm.shape[1]
    for a in range(lanes):
        t = t0 + a // group
        for j in range(lo[t] - jlo, hi[t] - jlo):
            pm[j, a] = _prob(w[a, j], inv[a], p16)
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
    for a in range(lanes):
        for d in range(head_dim):
            kqv[a, d] = kqvt[d, a]


@numba.njit(cache=True, nogil=True, inline="always")
def kqv_few(kqv, w, inv, v, cells, lo, hi, jlo, span, t0, group, ko, head_dim, lanes, p16, pm, vb):  # type: ignore[no-untyped-def]
    """kqv[a, d] = sum over the span's cells, in order, of p_aj * v_jd for few lanes: the dimensions are the
    register tile's lanes (``tile_sums``, 8 dimensions by 4 query lanes), with the probabilities zero
    outside each lane's cells. kqv: [lanes rounded up to 4, head_dim rounded up to 8] float64, zeroed;
    pm, vb: ``few_scratch``."""
    ncol, hd8 = pm.shape[1], vb.shape[1]
    for c0 in range(0, span, CELL_CHUNK):
        m = min(CELL_CHUNK, span - c0)
        _widen_rows(vb, v, cells, jlo + c0, m, ko, head_dim)
        for j in range(m):
            for a in range(lanes):
                t = t0 + a // group
                jj = c0 + j
                inside = lo[t] - jlo <= jj < hi[t] - jlo
                pm[j, a] = _prob(w[a, jj], inv[a], p16) if inside else 0.0
        for d0 in range(0, hd8, TILE_LANES):
            for a0 in range(0, ncol, TILE_COLS):
                tile_sums(kqv, a0 * hd8 + d0, vb, d0, pm, a0, m, hd8, ncol, 1, hd8)  # type: ignore[call-arg]


@numba.njit(cache=True, nogil=True, inline="always")
def _prob(e, inv, p16):  # type: ignore[no-untyped-def]
    """A softmax output as mul_mat(v, kq) reads it: e * (1 / sum), rounded to f16 for an f16 V cache."""
    p = e * inv
    return round_f16(p) if p16 else p  # type: ignore[call-arg]
