# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""Quantizing to IQ1_S and IQ1_M (ggml's quantize_row_iq1_s_impl / quantize_row_iq1_m_impl).

Weights take the three values -1, 0, 1 shifted by +-IQ1S_DELTA; groups of 8 take one entry of the
2048-entry IQ1S grid. A block (32 weights for IQ1_S, 16 for IQ1_M) sorts its weights and tries every
split into the three values exactly (prefix sums), with either shift (IQ1_M: one shift per half), then
moves the groups that are not on the grid to their best neighbour. IQ1_S needs importance weights in
llama.cpp (without them these kernels weight by x*x, which ``llama_quant.quantize`` never asks for).
The sort is stable, as glibc's qsort (a merge sort) is for these small arrays.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit, prange

from llama_quant.formats.common import f32_to_f16, put_f16, sum_sq
from llama_quant.formats.iq_grid_init import grid_tables
from llama_quant.formats.iq_search import FLT_MAX, block_weights, group_index, scale_code

__all__ = ["quantize_iq1_m", "quantize_iq1_s"]

_f = np.float32
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_XP = np.array([-1 + 0.125, 0.125, 1 + 0.125], np.float32)  # x_p, IQ1S_DELTA = IQ1M_DELTA = 0.125
_XM = np.array([-1 - 0.125, -0.125, 1 - 0.125], np.float32)  # x_m
_EPS_S = np.float32(1e-12)  # GROUP_MAX_EPS_IQ1_S
_EPS_M = np.float32(1e-7)  # GROUP_MAX_EPS_IQ1_M
_FUDGE_S = np.float32(1.125)
_FUDGE_M = np.float32(1.1125)
_MASKS_M = np.array([0x00, 0x80, 0x08, 0x88], np.int64)


@njit(cache=True, inline="always", error_model="numpy")
def _absmax(xb, n):
    m = abs(xb[0])
    for i in range(1, n):
        a = abs(xb[i])
        m = m if m > a else a
    return m


@njit(cache=True, error_model="numpy")
def _neighbour2(neigh, off, grid, xb, weight, b, scale, xx, L):
    """iq1_find_best_neighbour2: the listed entry nearest to xb[b:b+8] at scale, levels mapped through xx."""
    n = np.int64(neigh[off])
    best = FLT_MAX
    gi = -1
    for j in range(1, n + 1):
        e = np.int64(neigh[off + j])
        d2 = _ZERO
        for i in range(8):
            q = xx[(np.int64(grid[e, i]) - 1) // 2]
            diff = scale * q - xb[b + i]
            d2 += weight[b + i] * diff * diff
        if d2 < best:
            best = d2
            gi = e
    if gi < 0:  # only NaN distances (ggml's fallback then reads out of bounds and asserts)
        gi = np.int64(neigh[off + 1])
    for i in range(8):
        L[b + i] = (np.int64(grid[gi, i]) - 1) // 2
    return gi


@njit(cache=True, inline="always", error_model="numpy")
def _levels_from_split(order, b1, b2, n, L):
    for j in range(n):
        L[order[j]] = 0 if j < b1 else (1 if j < b2 else 2)


@njit(cache=True, inline="always", error_model="numpy")
def _snap(L, k, grid, kmap, neigh, xb, weight, scale, xx, index):
    """Group k onto the grid (its best neighbour if off it); returns whether it was on the grid."""
    gi = np.int64(kmap[group_index(L, 8 * k, 8, 2)])
    if gi >= 0:
        index[k] = gi
        return True
    index[k] = _neighbour2(neigh, -gi - 1, grid, xb, weight, 8 * k, scale, xx, L)
    return False


@njit(cache=True, error_model="numpy")
def _iq1_s_split(xb, weight, order, sumx, sumw):
    """The exhaustive split search of one block of 32: (scale, i1, i2, shift); shift 0 when none."""
    order[:] = np.argsort(xb, kind="mergesort")
    sumx[0] = _ZERO
    sumw[0] = _ZERO
    for j in range(32):
        i = order[j]
        sumx[j + 1] = sumx[j] + weight[i] * xb[i]
        sumw[j + 1] = sumw[j] + weight[i]
    best = -FLT_MAX
    scale = _ZERO
    b1 = -1
    b2 = -1
    shift = 0
    for i1 in range(33):
        for i2 in range(i1, 33):
            for sgn in (1, -1):
                xx = _XP if sgn == 1 else _XM
                sqx = (
                    (sumx[i1] - sumx[0]) * xx[0]
                    + (sumx[i2] - sumx[i1]) * xx[1]
                    + (sumx[32] - sumx[i2]) * xx[2]
                )
                sq2 = (
                    (sumw[i1] - sumw[0]) * xx[0] * xx[0]
                    + (sumw[i2] - sumw[i1]) * xx[1] * xx[1]
                    + (sumw[32] - sumw[i2]) * xx[2] * xx[2]
                )
                if sq2 > _ZERO and sqx * sqx > best * sq2:
                    scale = sqx / sq2
                    best = scale * sqx
                    b1 = i1
                    b2 = i2
                    shift = sgn
    return scale, b1, b2, shift


@njit(cache=True, error_model="numpy")
def _iq1_s_row(x, qw, use_qw, y, ncols, grid, kmap, neigh):
    # block: f16 d | u8 qs[32] (grid entries, low bits) | u16 qh[8] (3 high bits per group, scale, shift)
    scales = np.empty(8, np.float32)
    shifts = np.empty(8, np.int64)
    qh = np.zeros(8, np.int64)
    weight = np.empty(32, np.float32)
    waux = np.empty(32, np.float32)
    sumx = np.empty(33, np.float32)
    sumw = np.empty(33, np.float32)
    order = np.empty(32, np.int64)
    L = np.zeros(32, np.int64)
    index = np.zeros(4, np.int64)
    for ibl in range(ncols // 256):
        xbl = x[256 * ibl : 256 * ibl + 256]
        yb = y[50 * ibl : 50 * ibl + 50]
        yb[:] = 0
        qh[:] = 0
        sigma2 = _f(2) * sum_sq(xbl) / _f(256)
        max_scale = _ZERO
        for ib in range(8):
            xb = xbl[32 * ib : 32 * ib + 32]
            block_weights(xb, qw, 256 * ibl + 32 * ib, use_qw, sigma2, _ZERO, weight, waux, 32)
            scales[ib] = _ZERO
            shifts[ib] = 1
            if _absmax(xb, 32) < _EPS_S:
                continue
            scale, b1, b2, shift = _iq1_s_split(xb, weight, order, sumx, sumw)
            if b1 < 0 or b2 < 0 or shift == 0:
                continue
            _levels_from_split(order, b1, b2, 32, L)
            if scale < _ZERO:
                for j in range(32):
                    L[j] = 2 - L[j]
                scale = -scale
                shift = -shift
            xx = _XP if shift == 1 else _XM
            all_on = True
            for k in range(4):
                all_on &= _snap(L, k, grid, kmap, neigh, xb, weight, scale, xx, index)
            if not all_on:
                sqx = _ZERO
                sq2 = _ZERO
                for k in range(4):
                    for j in range(8):
                        w = weight[8 * k + j]
                        q = xx[(np.int64(grid[index[k], j]) - 1) // 2]
                        sqx += w * q * xb[8 * k + j]
                        sq2 += w * q * q
                if sqx > _ZERO and sq2 > _ZERO:
                    scale = sqx / sq2
            h = 0
            for k in range(4):
                yb[2 + 4 * ib + k] = index[k] & 255
                h |= (index[k] >> 8) << (3 * k)
            qh[ib] = h
            scales[ib] = scale
            shifts[ib] = shift
            max_scale = max_scale if max_scale > scale else scale
        if max_scale != _ZERO:
            d = max_scale / _f(15)
            put_f16(yb, 0, d * _FUDGE_S)
            idd = _ONE / d
            for ib in range(8):
                lv = scale_code(idd, scales[ib], 7)
                if shifts[ib] == -1:
                    lv |= 8
                qh[ib] |= lv << 12
        for ib in range(8):
            yb[34 + 2 * ib] = qh[ib] & 0xFF
            yb[35 + 2 * ib] = qh[ib] >> 8


@njit(cache=True, error_model="numpy")
def _iq1_m_split(xb, weight, order, px, pw):
    """The exhaustive split search of one block of 16 with a shift per half: (scale, i1, i2, k), k = 2*(first
    half shifted down) + (second half shifted down); k = -1 when none."""
    order[:] = np.argsort(xb, kind="mergesort")
    # prefix sums per half of the block (each half has its own shift); with v0-v1 = v1-v2 = -1 the sum over
    # the three groups of a split is T*v2 - px[i1] - px[i2] (ggml's order of operations)
    for h in range(2):
        px[h, 0] = _ZERO
        pw[h, 0] = _ZERO
    for j in range(16):
        i = order[j]
        h = 0 if i < 8 else 1
        px[h, j + 1] = px[h, j] + weight[i] * xb[i]
        px[1 - h, j + 1] = px[1 - h, j]
        pw[h, j + 1] = pw[h, j] + weight[i]
        pw[1 - h, j + 1] = pw[1 - h, j]
    p2 = _XP[2]
    m2 = _XM[2]
    cp1 = _XP[0] * _XP[0] - _XP[1] * _XP[1]
    cp2 = _XP[1] * _XP[1] - _XP[2] * _XP[2]
    cm1 = _XM[0] * _XM[0] - _XM[1] * _XM[1]
    cm2 = _XM[1] * _XM[1] - _XM[2] * _XM[2]
    qxp = np.empty(2, np.float32)
    qxm = np.empty(2, np.float32)
    q2p = np.empty(2, np.float32)
    q2m = np.empty(2, np.float32)
    sqx = np.empty(4, np.float32)
    sq2 = np.empty(4, np.float32)
    best = -FLT_MAX
    scale = _ZERO
    b1 = -1
    b2 = -1
    bk = -1
    for i1 in range(17):
        for i2 in range(i1, 17):
            for h in range(2):
                sx = px[h, i1] + px[h, i2]
                qxp[h] = px[h, 16] * p2 - sx
                qxm[h] = px[h, 16] * m2 - sx
                q2p[h] = pw[h, 16] * p2 * p2 + pw[h, i1] * cp1 + pw[h, i2] * cp2
                q2m[h] = pw[h, 16] * m2 * m2 + pw[h, i1] * cm1 + pw[h, i2] * cm2
            sqx[0] = qxp[0] + qxp[1]
            sqx[1] = qxp[0] + qxm[1]
            sqx[2] = qxm[0] + qxp[1]
            sqx[3] = qxm[0] + qxm[1]
            sq2[0] = q2p[0] + q2p[1]
            sq2[1] = q2p[0] + q2m[1]
            sq2[2] = q2m[0] + q2p[1]
            sq2[3] = q2m[0] + q2m[1]
            for k in range(4):
                if sq2[k] > _ZERO and sqx[k] * sqx[k] > best * sq2[k]:
                    scale = sqx[k] / sq2[k]
                    best = scale * sqx[k]
                    b1 = i1
                    b2 = i2
                    bk = k
    return scale, b1, b2, bk


@njit(cache=True, inline="always", error_model="numpy")
def _half_values(bk, k):
    # the shift of half k of an IQ1_M block: bit 1 of bk for the first half, bit 0 for the second
    down = bk >= 2 if k == 0 else bk % 2 == 1
    return _XM if down else _XP


@njit(cache=True, error_model="numpy")
def _iq1_m_block(xb, weight, order, px, pw, L, index, grid, kmap, neigh):
    """(scale, shift code) of one block of 16, grid entries in index; (0, -1) for an empty block."""
    if _absmax(xb, 16) < _EPS_M:
        return _ZERO, -1
    scale, b1, b2, bk = _iq1_m_split(xb, weight, order, px, pw)
    if b1 < 0 or b2 < 0 or bk < 0:
        return _ZERO, -1
    _levels_from_split(order, b1, b2, 16, L)
    if scale < _ZERO:
        for j in range(16):
            L[j] = 2 - L[j]
        scale = -scale
        bk = 3 - bk
    all_on = True
    for k in range(2):
        all_on &= _snap(L, k, grid, kmap, neigh, xb, weight, scale, _half_values(bk, k), index)
    if not all_on:
        sqx = _ZERO
        sq2 = _ZERO
        for k in range(2):
            xx = _half_values(bk, k)
            for j in range(8):
                w = weight[8 * k + j]
                q = xx[(np.int64(grid[index[k], j]) - 1) // 2]
                sqx += w * q * xb[8 * k + j]
                sq2 += w * q * q
        if sqx > _ZERO and sq2 > _ZERO:
            scale = sqx / sq2
    return scale, bk


@njit(cache=True, error_model="numpy")
def _iq1_m_row(x, qw, use_qw, y, ncols, grid, kmap, neigh):
    # block: u8 qs[32] | u8 qh[16] (3 high bits + shift bit per group) | u16 scales[4] (+ f16 d in top nibbles)
    scales = np.empty(16, np.float32)
    shifts = np.empty(16, np.int64)
    weight = np.empty(16, np.float32)
    waux = np.empty(16, np.float32)
    order = np.empty(16, np.int64)
    px = np.empty((2, 17), np.float32)
    pw = np.empty((2, 17), np.float32)
    L = np.zeros(16, np.int64)
    index = np.zeros(2, np.int64)
    sc = np.zeros(4, np.int64)
    for ibl in range(ncols // 256):
        xbl = x[256 * ibl : 256 * ibl + 256]
        yb = y[56 * ibl : 56 * ibl + 56]
        yb[:] = 0
        sigma2 = _f(2) * sum_sq(xbl) / _f(256)
        max_scale = _ZERO
        for ib in range(16):
            xb = xbl[16 * ib : 16 * ib + 16]
            block_weights(xb, qw, 256 * ibl + 16 * ib, use_qw, sigma2, _ZERO, weight, waux, 16)
            scale, bk = _iq1_m_block(xb, weight, order, px, pw, L, index, grid, kmap, neigh)
            if bk < 0:
                scales[ib] = _ZERO
                shifts[ib] = 0
                continue
            yb[2 * ib] = index[0] & 255
            yb[2 * ib + 1] = index[1] & 255
            yb[32 + ib] = (index[0] >> 8) | ((index[1] >> 8) << 4)
            scales[ib] = scale
            shifts[ib] = bk
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == _ZERO:
            continue
        _iq1_m_scales(
            xbl, qw, 256 * ibl, use_qw, sigma2, max_scale, scales, shifts, weight, waux, yb, sc, grid
        )


@njit(cache=True, error_model="numpy")
def _iq1_m_scales(xbl, qw, q0, use_qw, sigma2, max_scale, scales, shifts, weight, waux, yb, sc, grid):
    """The 3-bit block scales, shift bits and the super-block scale refit over the stored blocks."""
    sc[:] = 0
    d = max_scale / _f(15)
    idd = _ONE / d
    sqx = _ZERO
    sq2 = _ZERO
    for ib in range(16):
        lv = scale_code(idd, scales[ib], 7)
        sc[ib // 4] |= lv << (3 * (ib % 4))
        yb[32 + ib] |= _MASKS_M[shifts[ib]]
        xb = xbl[16 * ib : 16 * ib + 16]
        block_weights(xb, qw, q0 + 16 * ib, use_qw, sigma2, _ZERO, weight, waux, 16)
        qh = np.int64(yb[32 + ib])
        for k in range(2):
            xx = _half_values(shifts[ib], k)
            e = np.int64(yb[2 * ib + k]) + ((qh << (8 - 4 * k)) & 0x700)
            for j in range(8):
                w = weight[8 * k + j]
                q = xx[(np.int64(grid[e, j]) - 1) // 2] * _f(2 * lv + 1)
                sqx += w * q * xb[8 * k + j]
                sq2 += w * q * q
    if sq2 > _ZERO:
        d = sqx / sq2
    s = np.int64(f32_to_f16(d * _FUDGE_M))
    sc[0] |= (s & 0x000F) << 12
    sc[1] |= (s & 0x00F0) << 8
    sc[2] |= (s & 0x0F00) << 4
    sc[3] |= s & 0xF000
    for i in range(4):
        yb[48 + 2 * i] = sc[i] & 0xFF
        yb[49 + 2 * i] = sc[i] >> 8


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_iq1_s(x, qw, nrows, ncols, out, grid, kmap, neigh):
    rb = ncols // 256 * 50
    use_qw = qw.size > 0
    for r in prange(nrows):
        _iq1_s_row(
            x[r * ncols : (r + 1) * ncols], qw, use_qw, out[r * rb : (r + 1) * rb], ncols, grid, kmap, neigh
        )


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_iq1_m(x, qw, nrows, ncols, out, grid, kmap, neigh):
    rb = ncols // 256 * 56
    use_qw = qw.size > 0
    for r in prange(nrows):
        _iq1_m_row(
            x[r * ncols : (r + 1) * ncols], qw, use_qw, out[r * rb : (r + 1) * rb], ncols, grid, kmap, neigh
        )


def quantize_iq1_s(x, qw, nrows, ncols, out):
    """IQ1_S rows (registry kernel signature); the bytes of ggml's quantize_iq1_s."""
    _quantize_iq1_s(x, qw, nrows, ncols, out, *grid_tables(GGMLQuantizationType.IQ1_S))


def quantize_iq1_m(x, qw, nrows, ncols, out):
    """IQ1_M rows (registry kernel signature); the bytes of ggml's quantize_iq1_m."""
    _quantize_iq1_m(x, qw, nrows, ncols, out, *grid_tables(GGMLQuantizationType.IQ1_M))
