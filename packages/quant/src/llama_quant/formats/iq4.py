# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""The non-linear 4-bit formats IQ4_NL (32-weight blocks) and IQ4_XS (256-weight super-blocks).

Both quantize through ggml's quantize_row_iq4_nl_impl with ntry=7, with or without importance weights
(quantize_iq4_nl / quantize_iq4_xs as called by ggml_quantize_chunk). Block layouts:
  IQ4_NL {f16 d; u8 qs[16]}                                    18 bytes
  IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}     136 bytes
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit

from llama_quant.formats.common import absmax_signed, get_f16, nearest_int, put_f16, sum_sq
from llama_quant.formats.drivers import dequantize_blocks, quantize_rows
from llama_quant.formats.ref import iq4 as ref
from llama_quant.registry import BlockFormat

__all__ = ["KVALUES_IQ4NL", "dequantize_iq4_nl", "dequantize_iq4_xs", "quantize_iq4_nl", "quantize_iq4_xs"]

# kvalues_iq4nl (ggml-common.h)
KVALUES_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)

_f = np.float32
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_EPS = np.float32(1e-15)
_NTRY = 7


@njit(cache=True, inline="always", error_model="numpy")
def _best_index(x):
    # best_index_int8(16, kvalues_iq4nl, x)
    v = KVALUES_IQ4NL
    if x <= _f(v[0]):
        return 0
    if x >= _f(v[15]):
        return 15
    ml = 0
    mu = 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < _f(v[mav]):
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - _f(v[mu - 1]) < _f(v[mu]) - x else mu


@njit(cache=True, inline="always", error_model="numpy")
def _best_index_flat(x):
    # _best_index without the binary search's branches (same result), so that candidates vectorize
    v = KVALUES_IQ4NL
    if x != x:
        return 15
    if x <= _f(v[0]):
        return 0
    if x >= _f(v[15]):
        return 15
    mu = 1
    for k in range(1, 15):
        mu += 1 if x >= _f(v[k]) else 0
    return mu - 1 if x - _f(v[mu - 1]) < _f(v[mu]) - x else mu


@njit(cache=True, error_model="numpy")
def _iq4_superblock(x, qw, use_qw, L, scales, weight, st):
    """First pass of quantize_row_iq4_nl_impl over x (32 or 256 weights): per-32 scales, L; returns max_scale."""
    v = KVALUES_IQ4NL
    sigma2 = sum_sq(x) * (_f(2.0) / _f(x.size))
    max_scale = _ZERO
    amax_scale = _ZERO
    for ib in range(x.size // 32):
        xb = x[ib * 32 : ib * 32 + 32]
        for j in range(32):
            weight[j] = qw[ib * 32 + j] * np.sqrt(sigma2 + xb[j] * xb[j]) if use_qw else xb[j] * xb[j]
        amax, vmax = absmax_signed(xb, 32)
        if amax < _EPS:
            scales[ib] = _ZERO
            continue
        d = -vmax / _f(v[0])
        idd = _ONE / d
        sumqx = _ZERO
        sumq2 = _ZERO
        for j in range(32):
            li = _best_index(idd * xb[j])
            L[ib * 32 + j] = li
            q = _f(v[li])
            sumqx += weight[j] * q * xb[j]
            sumq2 += weight[j] * q * q
        d = sumqx / sumq2 if sumq2 > _ZERO else _ZERO
        best = d * sumqx
        # the 2*ntry+1 candidate scales are independent: accumulate them side by side, then choose in order
        ids = st[0]
        sqx = st[1]
        sq2 = st[2]
        for t in range(2 * _NTRY + 1):
            ids[t] = _f(t - _NTRY + np.int64(v[0])) / vmax
            sqx[t] = _ZERO
            sq2[t] = _ZERO
        for j in range(32):
            xj = xb[j]
            w = weight[j]
            for t in range(2 * _NTRY + 1):
                q = _f(v[_best_index_flat(ids[t] * xj)])
                wq = w * q
                sqx[t] += wq * xj
                sq2[t] += wq * q
        for t in range(2 * _NTRY + 1):
            if sq2[t] > _ZERO and sqx[t] * sqx[t] > best * sq2[t]:
                d = sqx[t] / sq2[t]
                best = d * sqx[t]
        scales[ib] = d
        if abs(d) > amax_scale:
            amax_scale = abs(d)
            max_scale = d
    return max_scale


@njit(cache=True, error_model="numpy")
def _pack_nibbles(L, qs):
    for i in range(L.size // 32):
        for j in range(16):
            qs[16 * i + j] = np.int64(L[32 * i + j]) | (np.int64(L[32 * i + 16 + j]) << 4)


@njit(cache=True, inline="always", error_model="numpy")
def _scratch(n):
    # _iq4_superblock's arrays for n weights: levels, per-32 scales, weights, candidate sums
    return (
        np.zeros(n, np.uint8),
        np.empty(n // 32, np.float32),
        np.empty(32, np.float32),
        np.empty((3, 2 * _NTRY + 1), np.float32),
    )


@njit(cache=True, error_model="numpy")
def _iq4_nl_row(x, qw, use_qw, y, ncols, nmax):
    L, scales, weight, st = _scratch(32)
    for ib in range(ncols // 32):
        xb = x[ib * 32 : ib * 32 + 32]
        yb = y[ib * 18 : ib * 18 + 18]
        _iq4_superblock(xb, qw[ib * 32 :], use_qw, L, scales, weight, st)
        put_f16(yb, 0, scales[0])
        idd = _ONE / scales[0] if scales[0] != _ZERO else _ZERO
        for j in range(32):
            L[j] = _best_index(idd * xb[j])
        _pack_nibbles(L, yb[2:18])


@njit(cache=True, error_model="numpy")
def _iq4_xs_row(x, qw, use_qw, y, ncols, nmax):
    L, scales, weight, st = _scratch(256)
    for ib in range(ncols // 256):
        xb = x[ib * 256 : ib * 256 + 256]
        yb = y[ib * 136 : ib * 136 + 136]
        max_scale = _iq4_superblock(xb, qw[ib * 256 :], use_qw, L, scales, weight, st)
        d = -max_scale / _f(32.0)
        put_f16(yb, 0, d)
        idd = _ONE / d if d != _ZERO else _ZERO
        scales_h = 0
        for k in range(8):
            lv = max(-32, min(31, nearest_int(idd * scales[k])))
            dl = d * _f(lv)
            idl = _ONE / dl if dl != _ZERO else _ZERO
            for j in range(32):
                L[32 * k + j] = _best_index(idl * xb[32 * k + j])
            lv += 32
            if k % 2 == 0:
                yb[4 + k // 2] = lv & 0xF
            else:
                yb[4 + k // 2] = np.int64(yb[4 + k // 2]) | ((lv & 0xF) << 4)
            scales_h |= (lv >> 4) << (2 * k)
        yb[2] = scales_h & 0xFF
        yb[3] = scales_h >> 8
        _pack_nibbles(L, yb[8:136])


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_iq4_nl(x, qw, nrows, ncols, out):
    quantize_rows(_iq4_nl_row, x, qw, nrows, ncols, out, 32, 18)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_iq4_xs(x, qw, nrows, ncols, out):
    quantize_rows(_iq4_xs_row, x, qw, nrows, ncols, out, 256, 136)


@njit(cache=True, inline="always", error_model="numpy")
def _dq_iq4_nl(b, y):
    d = get_f16(b, 0)
    for j in range(16):
        q = np.int64(b[2 + j])
        y[j] = d * _f(KVALUES_IQ4NL[q & 0xF])
        y[j + 16] = d * _f(KVALUES_IQ4NL[q >> 4])


@njit(cache=True, error_model="numpy")
def _dq_iq4_xs(b, y):
    d = get_f16(b, 0)
    sh = np.int64(b[2]) | (np.int64(b[3]) << 8)
    for k in range(8):
        ls = ((np.int64(b[4 + k // 2]) >> (4 * (k % 2))) & 0xF) | (((sh >> (2 * k)) & 3) << 4)
        dl = d * _f(ls - 32)
        for j in range(16):
            q = np.int64(b[8 + 16 * k + j])
            y[32 * k + j] = dl * _f(KVALUES_IQ4NL[q & 0xF])
            y[32 * k + j + 16] = dl * _f(KVALUES_IQ4NL[q >> 4])


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_iq4_nl(raw, n, out):
    dequantize_blocks(_dq_iq4_nl, raw, n, out, 32, 18)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_iq4_xs(raw, n, out):
    dequantize_blocks(_dq_iq4_xs, raw, n, out, 256, 136)


class IQ4_NL(BlockFormat, qtype=GGMLQuantizationType.IQ4_NL):
    quantize_kernel = staticmethod(quantize_iq4_nl)
    quantize_ref = staticmethod(ref.quantize_iq4_nl)
    dequantize_kernel = staticmethod(dequantize_iq4_nl)
    dequantize_ref = staticmethod(ref.dequantize_iq4_nl)


class IQ4_XS(BlockFormat, qtype=GGMLQuantizationType.IQ4_XS):
    quantize_kernel = staticmethod(quantize_iq4_xs)
    quantize_ref = staticmethod(ref.quantize_iq4_xs)
    dequantize_kernel = staticmethod(dequantize_iq4_xs)
    dequantize_ref = staticmethod(ref.dequantize_iq4_xs)
