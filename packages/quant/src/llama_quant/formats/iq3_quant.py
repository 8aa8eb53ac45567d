# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""Quantizing to IQ3_XXS and IQ3_S (ggml's quantize_row_iq3_xxs_impl(256) / quantize_row_iq3_s_impl).

Groups of 4 weights take one entry of a 256- (IQ3_XXS) or 512-entry (IQ3_S) grid of levels {1, 3, .., 15};
signs go by groups of 8 (even parity and 7 bits for IQ3_XXS, all 8 bits for IQ3_S). Each block of 32
searches its scale over 31 (19) candidates; the 4-bit block scales are multiples of the fp16 super-block
scale, stored with ggml's fudge factors (1.0125, 1.033). Both work with or without importance weights.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit, prange

from llama_quant.formats.common import put_f16, sum_sq
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

__all__ = ["quantize_iq3_s", "quantize_iq3_xxs"]

_f = np.float32
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_FIFTH = np.float32(0.2)
_EPS_XXS = np.float32(1e-8)  # GROUP_MAX_EPS_IQ3_XXS
_FUDGE_XXS = np.float32(1.0125)
_FUDGE_S = np.float32(1.033)
_KMAXQ = 8


@njit(cache=True, error_model="numpy")
def _search(xval, weight, waux, L, Laux, on, on_aux, mx, steps, all_again, grid, kmap, neigh):
    """The scale of one block of 32 with max |x| = mx: 2*steps+1 candidates, then the groups off the grid
    (all of them with ``all_again``, as IQ3_S does) rounded again at the chosen scale; levels into L."""
    best = _ZERO
    scale = mx / _f(2 * _KMAXQ - 1)
    for step in range(-steps, steps + 1):
        idv = (_f(2 * _KMAXQ - 1) + _f(step) * _FIFTH) / mx
        this_scale = _ONE / idv
        for k in range(8):
            round_levels(xval, idv, Laux, 4 * k, 4, _KMAXQ - 1)
            on_aux[k] = snap_group(grid, kmap, neigh, xval, waux, this_scale, Laux, 4 * k, 3)[1]
        sumqx, sumq2 = weighted_sums(weight, xval, Laux, 32)
        if sumq2 > _ZERO and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            L[:] = Laux
            on[:] = on_aux
    if not on.all() and scale > _ZERO:
        idv = _ONE / scale
        for k in range(8):
            if on[k] and not all_again:
                continue
            round_levels(xval, idv, L, 4 * k, 4, _KMAXQ - 1)
            snap_group(grid, kmap, neigh, xval, waux, scale, L, 4 * k, 3)
        sumqx, sumq2 = weighted_sums(weight, xval, L, 32)
        if sumq2 > _ZERO:
            scale = sumqx / sumq2
    return scale


@njit(cache=True, inline="always", error_model="numpy")
def _scratch():
    return (
        np.empty(8, np.float32),  # scales
        np.empty(32, np.float32),  # weight
        np.empty(32, np.float32),  # waux
        np.empty(32, np.float32),  # xval
        np.zeros(32, np.int64),  # L
        np.zeros(32, np.int64),  # Laux
        np.zeros(8, np.bool_),  # on the grid
        np.zeros(8, np.bool_),
        np.zeros(4, np.int64),  # signs
    )


@njit(cache=True, error_model="numpy")
def _iq3_xxs_row(x, qw, use_qw, y, ncols, grid, kmap, neigh):
    # block: f16 d | u8 qs[64] (grid entries) | u32 scales_and_signs[8]
    scales, weight, waux, xval, L, Laux, on, on_aux, signs = _scratch()
    sas = np.zeros(8, np.int64)
    for ibl in range(ncols // 256):
        xbl = x[256 * ibl : 256 * ibl + 256]
        yb = y[98 * ibl : 98 * ibl + 98]
        yb[:] = 0
        sas[:] = 0
        sigma2 = _f(2) * sum_sq(xbl) / _f(256)
        max_scale = _ZERO
        for ib in range(8):
            xb = xbl[32 * ib : 32 * ib + 32]
            block_weights(xb, qw, 256 * ibl + 32 * ib, use_qw, sigma2, _ZERO, weight, waux, 32)
            for k in range(4):
                signs[k] = even_signs(xb, weight, xval, 8 * k, True)
            L[:] = 0
            mx = max_of(xval, 32)
            if mx < _EPS_XXS:
                scales[ib] = _ZERO
                continue
            on[:] = True
            scale = _search(xval, weight, waux, L, Laux, on, on_aux, mx, 15, False, grid, kmap, neigh)
            if scale < _ZERO:  # never expected (ggml flips the scale and the signs)
                scale = -scale
                for k in range(4):
                    signs[k] = (~signs[k]) & 127
            for k in range(8):
                yb[2 + 8 * ib + k] = kmap[group_index(L, 4 * k, 4, 3)] & 0xFF
            sas[ib] = signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21)
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == _ZERO:
            yb[:] = 0
            continue
        d = max_scale / _f(31)
        put_f16(yb, 0, d * _FUDGE_XXS)
        idd = _ONE / d
        for ib in range(8):
            v = sas[ib] | (scale_code(idd, scales[ib], 15) << 28)
            for b in range(4):
                yb[66 + 4 * ib + b] = (v >> (8 * b)) & 0xFF


@njit(cache=True, error_model="numpy")
def _iq3_s_row(x, qw, use_qw, y, ncols, grid, kmap, neigh):
    # block: f16 d | u8 qs[64] | u8 qh[8] | u8 signs[32] | u8 scales[4]
    scales, weight, waux, xval, L, Laux, on, on_aux, signs = _scratch()
    for ibl in range(ncols // 256):
        xbl = x[256 * ibl : 256 * ibl + 256]
        yb = y[110 * ibl : 110 * ibl + 110]
        yb[:] = 0
        sigma2 = _f(2) * sum_sq(xbl) / _f(256)
        max_scale = _ZERO
        # ggml advances its qs and signs pointers only past the blocks it stores: an all-zero block shifts
        # the following blocks' entries and signs down (while qh stays indexed by block)
        qpos = 2
        spos = 74
        for ib in range(8):
            xb = xbl[32 * ib : 32 * ib + 32]
            block_weights(xb, qw, 256 * ibl + 32 * ib, use_qw, sigma2, _ZERO, weight, waux, 32)
            for k in range(4):
                signs[k] = even_signs(xb, weight, xval, 8 * k, False)
            L[:] = 0
            mx = max_of(xval, 32)
            if mx == _ZERO:  # C: !max
                scales[ib] = _ZERO
                continue
            on[:] = False
            scale = _search(xval, weight, waux, L, Laux, on, on_aux, mx, 9, True, grid, kmap, neigh)
            if scale < _ZERO:  # never expected (ggml flips the scale and the signs)
                scale = -scale
                for k in range(4):
                    signs[k] = (~signs[k]) & 255
            for k in range(8):
                gi = np.int64(kmap[group_index(L, 4 * k, 4, 3)])
                yb[qpos + k] = gi & 255
                yb[66 + ib] |= (gi >> 8) << k
            qpos += 8
            for k in range(4):
                yb[spos + k] = signs[k]
            spos += 4
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == _ZERO:
            continue
        d = max_scale / _f(31)
        put_f16(yb, 0, d * _FUDGE_S)
        idd = _ONE / d
        for ib in range(0, 8, 2):
            yb[106 + ib // 2] = scale_code(idd, scales[ib], 15) | (scale_code(idd, scales[ib + 1], 15) << 4)


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_iq3_xxs(x, qw, nrows, ncols, out, grid, kmap, neigh):
    rb = ncols // 256 * 98
    use_qw = qw.size > 0
    for r in prange(nrows):
        _iq3_xxs_row(
            x[r * ncols : (r + 1) * ncols], qw, use_qw, out[r * rb : (r + 1) * rb], ncols, grid, kmap, neigh
        )


@njit(cache=True, parallel=True, error_model="numpy")
def _quantize_iq3_s(x, qw, nrows, ncols, out, grid, kmap, neigh):
    rb = ncols // 256 * 110
    use_qw = qw.size > 0
    for r in prange(nrows):
        _iq3_s_row(
            x[r * ncols : (r + 1) * ncols], qw, use_qw, out[r * rb : (r + 1) * rb], ncols, grid, kmap, neigh
        )


def quantize_iq3_xxs(x, qw, nrows, ncols, out):
    """IQ3_XXS rows (registry kernel signature); the bytes of ggml's quantize_iq3_xxs."""
    _quantize_iq3_xxs(x, qw, nrows, ncols, out, *grid_tables(GGMLQuantizationType.IQ3_XXS))


def quantize_iq3_s(x, qw, nrows, ncols, out):
    """IQ3_S rows (registry kernel signature); the bytes of ggml's quantize_iq3_s."""
    _quantize_iq3_s(x, qw, nrows, ncols, out, *grid_tables(GGMLQuantizationType.IQ3_S))
