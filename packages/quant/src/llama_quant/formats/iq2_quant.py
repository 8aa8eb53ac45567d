# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""Quantizing to IQ2_XXS, IQ2_XS and IQ2_S (ggml's quantize_row_iq2_xxs_impl, _iq2_xs_impl, _iq2_s_impl).

Groups of 8 weights take even-parity signs and one entry of a 256- (IQ2_XXS) or 512-entry (IQ2_XS) grid of
levels {1, 3, 5}; each block of 32 (16) weights searches its scale over 13 (19) candidates, and the blocks'
scales are stored as 4-bit multiples of the super-block's fp16 scale. IQ2_S is IQ2_XS's search on a
1024-entry grid with plain 8-bit signs, and works without importance weights. llama.cpp needs them for
IQ2_XXS and IQ2_XS (ggml asserts, llama-quantize refuses); without them these kernels weight by x*x, which
``llama_quant.quantize`` never asks for.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit, prange

from llama_quant.formats.common import make_qp_quants, put_f16, sum_sq
from llama_quant.formats.iq_grid_init import grid_tables
from llama_quant.formats.iq_search import (
    block_weights,
    even_signs,
    group_index,
    max_of,
    round_levels,
    scale_code,
    snap_group,
    weighted_sums,
)

__all__ = ["quantize_iq2_s", "quantize_iq2_xs", "quantize_iq2_xxs"]

_f = np.float32
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_TENTH = np.float32(0.1)
_EPS = np.float32(1e-15)  # GROUP_MAX_EPS
_EPS_S = np.float32(1e-8)  # GROUP_MAX_EPS_IQ2_S
_QUARTER = np.float32(0.25)
_FUDGE_S = np.float32(0.9875)
_KMAXQ = 3


@njit(cache=True, inline="always", error_model="numpy")
def _put_u32(y, pos, v):
    for b in range(4):
        y[pos + b] = (v >> (8 * b)) & 0xFF


@njit(cache=True, error_model="numpy")
def _xxs_block(xval, weight, waux, L, Laux, Lqp, grid, kmap, neigh):
    """(scale, True) and levels L of one block of 32 (signs already folded into xval); (0, False) for a block
    stored as zeros."""
    if max_of(xval, 32) < _EPS:
        return _ZERO, False
    scale = make_qp_quants(32, _KMAXQ + 1, xval, Lqp, weight)
    eff_max = scale * _f(_KMAXQ)
    if eff_max <= _ZERO:
        return _ZERO, False
    best = _ZERO
    for step in range(-6, 7):
        idv = (_f(2 * _KMAXQ - 1) + _f(step) * _TENTH) / eff_max
        this_scale = _ONE / idv
        for k in range(4):
            round_levels(xval, idv, Laux, 8 * k, 8, _KMAXQ - 1)
            snap_group(grid, kmap, neigh, xval, waux, this_scale, Laux, 8 * k, 2)
        sumqx, sumq2 = weighted_sums(weight, xval, Laux, 32)
        if sumq2 > _ZERO and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            L[:] = Laux
    if scale > _ZERO:
        idv = _ONE / scale
        for k in range(4):
            round_levels(xval, idv, L, 8 * k, 8, _KMAXQ - 1)
            snap_group(grid, kmap, neigh, xval, waux, scale, L, 8 * k, 2)
        sumqx, sumq2 = weighted_sums(weight, xval, L, 32)
        if sumq2 > _ZERO:
            scale = sumqx / sumq2
    return scale, True


@njit(cache=True, error_model="numpy")
def _iq2_xxs_row(x, qw, use_qw, y, ncols, grid, kmap, neigh):
    scales = np.empty(8, np.float32)
    weight = np.empty(32, np.float32)
    waux = np.empty(32, np.float32)
    xval = np.empty(32, np.float32)
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    Lqp = np.zeros(32, np.uint8)
    signs = np.zeros(4, np.int64)
    q2 = np.zeros(16, np.int64)
    for ibl in range(ncols // 256):
        xbl = x[256 * ibl : 256 * ibl + 256]
        yb = y[66 * ibl : 66 * ibl + 66]
        yb[:] = 0
        q2[:] = 0
        sigma2 = sum_sq(xbl) / _f(256)
        max_scale = _ZERO
        for ib in range(8):
            xb = xbl[32 * ib : 32 * ib + 32]
            block_weights(xb, qw, 256 * ibl + 32 * ib, use_qw, sigma2, _ZERO, weight, waux, 32)
            for k in range(4):
                signs[k] = even_signs(xb, weight, xval, 8 * k, True)
            scale, kept = _xxs_block(xval, weight, waux, L, Laux, Lqp, grid, kmap, neigh)
            if not kept:
                scales[ib] = _ZERO
                continue
            if scale < _ZERO:  # never expected (ggml flips the scale and the signs)
                scale = -scale
                for k in range(4):
                    signs[k] = (~signs[k]) & 127
            for k in range(4):
                gi = kmap[group_index(L, 8 * k, 8, 2)]
                q2[2 * ib] |= np.int64(gi) << (8 * k)
                q2[2 * ib + 1] |= signs[k] << (7 * k)
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == _ZERO:
            continue
        d = max_scale / _f(31)
        put_f16(yb, 0, d)
        idd = _ONE / d
        for ib in range(8):
            q2[2 * ib + 1] |= scale_code(idd, scales[ib], 15) << 28
        for j in range(16):
            _put_u32(yb, 2 + 4 * j, q2[j])


@njit(cache=True, error_model="numpy")
def _xs_block(xval, weight, waux, L, Laux, on, on_aux, eps, grid, kmap, neigh):
    """(scale, True) and levels L of one block of 16 (IQ2_XS, IQ2_S); (0, False) for a block stored as
    zeros (max below eps)."""
    mx = max_of(xval, 16)
    L[:] = 0
    if mx < eps:
        return _ZERO, False
    best = _ZERO
    scale = mx / _f(2 * _KMAXQ - 1)
    on[:] = True
    for step in range(-9, 10):
        idv = (_f(2 * _KMAXQ - 1) + _f(step) * _TENTH) / mx
        this_scale = _ONE / idv
        for k in range(2):
            round_levels(xval, idv, Laux, 8 * k, 8, _KMAXQ - 1)
            on_aux[k] = snap_group(grid, kmap, neigh, xval, waux, this_scale, Laux, 8 * k, 2)[1]
        sumqx, sumq2 = weighted_sums(weight, xval, Laux, 16)
        if sumq2 > _ZERO and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            L[:] = Laux
            on[:] = on_aux
    if (not on[0] or not on[1]) and scale > _ZERO:
        idv = _ONE / scale
        for k in range(2):
            if on[k]:
                continue
            round_levels(xval, idv, L, 8 * k, 8, _KMAXQ - 1)
            snap_group(grid, kmap, neigh, xval, waux, scale, L, 8 * k, 2)
        sumqx, sumq2 = weighted_sums(weight, xval, L, 16)
        if sumq2 > _ZERO:
            scale = sumqx / sumq2
    return scale, True


@njit(cache=True, error_model="numpy")
def _iq2_xs_row(x, qw, use_qw, y, ncols, grid, kmap, neigh):
    scales = np.empty(16, np.float32)
    weight = np.empty(16, np.float32)
    waux = np.empty(16, np.float32)
    xval = np.empty(16, np.float32)
    L = np.zeros(16, np.int64)
    Laux = np.zeros(16, np.int64)
    on = np.zeros(2, np.bool_)
    on_aux = np.zeros(2, np.bool_)
    signs = np.zeros(2, np.int64)
    q2 = np.zeros(32, np.int64)
    for ibl in range(ncols // 256):
        xbl = x[256 * ibl : 256 * ibl + 256]
        yb = y[74 * ibl : 74 * ibl + 74]
        yb[:] = 0
        q2[:] = 0
        sigma2 = sum_sq(xbl) / _f(256)
        max_scale = _ZERO
        for ib in range(16):
            xb = xbl[16 * ib : 16 * ib + 16]
            block_weights(xb, qw, 256 * ibl + 16 * ib, use_qw, sigma2, _ZERO, weight, waux, 16)
            for k in range(2):
                signs[k] = even_signs(xb, weight, xval, 8 * k, True)
            scale, kept = _xs_block(xval, weight, waux, L, Laux, on, on_aux, _EPS, grid, kmap, neigh)
            if not kept:
                scales[ib] = _ZERO
                continue
            if scale < _ZERO:  # never expected (ggml flips the scale and the signs)
                scale = -scale
                for k in range(2):
                    signs[k] = (~signs[k]) & 127
            for k in range(2):
                q2[2 * ib + k] = np.int64(kmap[group_index(L, 8 * k, 8, 2)]) | (signs[k] << 9)
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == _ZERO:
            continue
        d = max_scale / _f(31)
        put_f16(yb, 0, d)
        idd = _ONE / d
        for ib in range(16):
            yb[66 + ib // 2] |= scale_code(idd, scales[ib], 15) << (4 * (ib % 2))
        for j in range(32):
            yb[2 + 2 * j] = q2[j] & 0xFF
            yb[3 + 2 * j] = q2[j] >> 8


@njit(cache=True, error_model="numpy")
def _iq2_s_row(x, qw, use_qw, y, ncols, grid, kmap, neigh):
    # block: f16 d | u8 qs[32] (grid entries, low bits) | u8 signs[32] | u8 qh[8] | u8 scales[8]
    scales = np.empty(16, np.float32)
    weight = np.empty(16, np.float32)
    waux = np.empty(16, np.float32)
    xval = np.empty(16, np.float32)
    L = np.zeros(16, np.int64)
    Laux = np.zeros(16, np.int64)
    on = np.zeros(2, np.bool_)
    on_aux = np.zeros(2, np.bool_)
    signs = np.zeros(2, np.int64)
    for ibl in range(ncols // 256):
        xbl = x[256 * ibl : 256 * ibl + 256]
        yb = y[82 * ibl : 82 * ibl + 82]
        yb[:] = 0
        sigma2 = _f(2) * sum_sq(xbl) / _f(256)
        floor = _QUARTER * sigma2
        max_scale = _ZERO
        for ib in range(16):
            xb = xbl[16 * ib : 16 * ib + 16]
            block_weights(xb, qw, 256 * ibl + 16 * ib, use_qw, sigma2, floor, weight, waux, 16)
            for k in range(2):
                signs[k] = even_signs(xb, weight, xval, 8 * k, False)
            scale, kept = _xs_block(xval, weight, waux, L, Laux, on, on_aux, _EPS_S, grid, kmap, neigh)
            if not kept:
                scales[ib] = _ZERO
                continue
            if scale < _ZERO:  # never expected (ggml flips the scale and the signs)
                scale = -scale
                for k in range(2):
                    signs[k] = (~signs[k]) & 255
            for k in range(2):
                i8 = 2 * ib + k
                gi = np.int64(kmap[group_index(L, 8 * k, 8, 2)])
                yb[2 + i8] = gi & 255
                yb[66 + i8 // 4] |= (gi >> 8) << (2 * (i8 % 4))
                yb[34 + i8] = signs[k]
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == _ZERO:
            continue
        d = max_scale / _f(31)
        put_f16(yb, 0, d * _FUDGE_S)
        idd = _ONE / d
        for ib in range(16):
            yb[74 + ib // 2] |= scale_code(idd, scales[ib], 15) << (4 * (ib % 2))


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_iq2_xxs(x, qw, nrows, ncols, out, grid, kmap, neigh):
    rb = ncols // 256 * 66
    use_qw = qw.size > 0
    for r in prange(nrows):
        _iq2_xxs_row(
            x[r * ncols : (r + 1) * ncols], qw, use_qw, out[r * rb : (r + 1) * rb], ncols, grid, kmap, neigh
        )


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_iq2_xs(x, qw, nrows, ncols, out, grid, kmap, neigh):
    rb = ncols // 256 * 74
    use_qw = qw.size > 0
    for r in prange(nrows):
        _iq2_xs_row(
            x[r * ncols : (r + 1) * ncols], qw, use_qw, out[r * rb : (r + 1) * rb], ncols, grid, kmap, neigh
        )


def quantize_iq2_xxs(x, qw, nrows, ncols, out):
    """IQ2_XXS rows (registry kernel signature); the bytes of ggml's quantize_iq2_xxs."""
    _quantize_iq2_xxs(x, qw, nrows, ncols, out, *grid_tables(GGMLQuantizationType.IQ2_XXS))


def quantize_iq2_xs(x, qw, nrows, ncols, out):
    """IQ2_XS rows (registry kernel signature); the bytes of ggml's quantize_iq2_xs."""
    _quantize_iq2_xs(x, qw, nrows, ncols, out, *grid_tables(GGMLQuantizationType.IQ2_XS))


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_iq2_s(x, qw, nrows, ncols, out, grid, kmap, neigh):
    rb = ncols // 256 * 82
    use_qw = qw.size > 0
    for r in prange(nrows):
        _iq2_s_row(
            x[r * ncols : (r + 1) * ncols], qw, use_qw, out[r * rb : (r + 1) * rb], ncols, grid, kmap, neigh
        )


def quantize_iq2_s(x, qw, nrows, ncols, out):
    """IQ2_S rows (registry kernel signature); the bytes of ggml's quantize_iq2_s."""
    _quantize_iq2_s(x, qw, nrows, ncols, out, *grid_tables(GGMLQuantizationType.IQ2_S))
