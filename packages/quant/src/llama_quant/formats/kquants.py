# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""The 256-weight super-block k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Quantize follows ggml_quantize_chunk: without importance weights quantize_row_q*_K_ref over the rows,
with them quantize_row_q*_K_impl row by row. Block layouts (ggml-common.h):
  Q2_K {u8 scales[16]; u8 qs[64]; f16 d, dmin}              84 bytes
  Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}      110 bytes
  Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}             144 bytes
  Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}  176 bytes
  Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}        210 bytes
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit

from llama_quant.formats.common import (
    absmax_signed,
    make_q3_quants,
    make_qp_quants,
    make_qx_quants,
    nearest_int,
    put_f16,
    qkx_groups,
    sum_sq,
)
from llama_quant.formats.drivers import quantize_rows
from llama_quant.formats.kquants_dequant import (
    dequantize_q2_k,
    dequantize_q3_k,
    dequantize_q4_k,
    dequantize_q5_k,
    dequantize_q6_k,
    scale_min_k4,
)
from llama_quant.formats.ref import kquants as ref
from llama_quant.registry import BlockFormat

__all__ = [
    "dequantize_q2_k",
    "dequantize_q3_k",
    "dequantize_q4_k",
    "dequantize_q5_k",
    "dequantize_q6_k",
    "quantize_q2_k",
    "quantize_q3_k",
    "quantize_q4_k",
    "quantize_q5_k",
    "quantize_q6_k",
]

_f = np.float32
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_EPS = np.float32(1e-15)  # GROUP_MAX_EPS


@njit(cache=True, error_model="numpy")
def _pack_2bit(L, qs):
    # 4 values of 2 bits per byte: qs[j/4 + l] = L[j+l] | L[j+l+32] << 2 | L[j+l+64] << 4 | L[j+l+96] << 6
    for j in range(0, 256, 128):
        for m in range(32):
            qs[j // 4 + m] = (
                np.int64(L[j + m])
                | (np.int64(L[j + m + 32]) << 2)
                | (np.int64(L[j + m + 64]) << 4)
                | (np.int64(L[j + m + 96]) << 6)
            )


@njit(cache=True, inline="always", error_model="numpy")
def _impl_weights(xb, qwb, sigma2, gs, weights, sw):
    # the _impl weights of a super-block, qw[j] * sqrtf(sigma2 + x[j]^2), and their sum per group of gs
    for j in range(256 // gs):
        sv = _ZERO
        for m in range(gs):
            v = xb[gs * j + m]
            wv = qwb[gs * j + m] * np.sqrt(sigma2 + v * v)
            weights[gs * j + m] = wv
            sv += wv
        sw[j] = sv


@njit(cache=True, inline="always", error_model="numpy")
def _max0(v):
    # max(0, v[0], v[1], ...) in order, as the _ref functions' max_scale / max_min loops
    m = _ZERO
    for j in range(v.size):
        if v[j] > m:
            m = v[j]
    return m


@njit(cache=True, inline="always", error_model="numpy")
def _rows_per_span(ncols):
    # whole rows per work item: enough sub-blocks side by side for make_qkx_lanes to vectorize
    return max(1, 4096 // ncols)


@njit(cache=True, error_model="numpy")
def _q2_k_span(x, qw, use_qw, y, ncols, nmax):
    # a span of whole rows: quantize_row_q2_K_ref, or quantize_row_q2_K_impl row by row
    nsb = x.size // 256
    weights = np.empty(x.size, np.float32)
    scales_all = np.empty(nsb * 16, np.float32)
    mins_all = np.empty(nsb * 16, np.float32)
    sw = np.empty(nsb * 16, np.float32)
    L = np.empty(x.size, np.uint8)
    Ls = np.empty(16, np.uint8)
    Lm = np.empty(16, np.uint8)
    q4scale = _f(15.0)
    for i in range(nsb):
        xb = x[i * 256 : i * 256 + 256]
        if not use_qw:
            for m in range(256):
                weights[i * 256 + m] = abs(xb[m])
        else:
            qo = (i % (ncols // 256)) * 256
            _impl_weights(xb, qw[qo : qo + 256], sum_sq(xb) / _f(256), 16, weights[i * 256 :], sw[i * 16 :])
    if not use_qw:
        qkx_groups(x, weights, 16, 3, _f(-0.5), _f(0.1), 15, True, True, scales_all, mins_all, L)
    else:
        qkx_groups(x, weights, 16, 3, _f(-0.9), _f(0.05), 36, False, False, scales_all, mins_all, L)
    for i in range(nsb):
        xb = x[i * 256 : i * 256 + 256]
        yb = y[i * 84 : i * 84 + 84]
        Lb = L[i * 256 : i * 256 + 256]
        scales = scales_all[i * 16 : i * 16 + 16]
        mins = mins_all[i * 16 : i * 16 + 16]
        if not use_qw:  # quantize_row_q2_K_ref
            max_scale = _max0(scales)
            max_min = _max0(mins)
            if max_scale > _ZERO:
                iscale = q4scale / max_scale
                for j in range(16):
                    yb[j] = nearest_int(iscale * scales[j]) & 0xFF
                dm = put_f16(yb, 80, max_scale / q4scale)
            else:
                for j in range(16):
                    yb[j] = 0
                dm = put_f16(yb, 80, _ZERO)
            if max_min > _ZERO:
                iscale = q4scale / max_min
                for j in range(16):
                    yb[j] = (np.int64(yb[j]) | (nearest_int(iscale * mins[j]) << 4)) & 0xFF
                mm = put_f16(yb, 82, max_min / q4scale)
            else:
                mm = put_f16(yb, 82, _ZERO)
        else:  # quantize_row_q2_K_impl
            dm = put_f16(yb, 80, make_qp_quants(16, 15, scales, Ls, sw[i * 16 : i * 16 + 16]))
            mm = put_f16(yb, 82, make_qp_quants(16, 15, mins, Lm, sw[i * 16 : i * 16 + 16]))
            for j in range(16):
                yb[j] = np.int64(Ls[j]) | (np.int64(Lm[j]) << 4)
        for j in range(16):
            d = dm * _f(np.int64(yb[j]) & 0xF)
            if d == _ZERO:
                continue
            m = mm * _f(np.int64(yb[j]) >> 4)
            for ii in range(16):
                Lb[16 * j + ii] = max(0, min(3, nearest_int((xb[16 * j + ii] + m) / d)))
        _pack_2bit(Lb, yb[16:80])


@njit(cache=True, error_model="numpy")
def _q3_k_row(x, qw, use_qw, y, ncols, nmax):
    qxst = np.empty((3, 19), np.float32)
    L = np.zeros(x.size, np.int8)
    scales_all = np.empty(x.size // 16, np.float32)
    weight = np.empty(256, np.float32)
    sw = np.empty(16, np.float32)
    Ls = np.empty(16, np.int8)
    for i in range(x.size // 256):
        xb = x[i * 256 : i * 256 + 256]
        yb = y[i * 110 : i * 110 + 110]
        sc = yb[96:108]
        sc[:] = 0
        max_scale = _ZERO
        Lb = L[i * 256 : i * 256 + 256]
        scales = scales_all[i * 16 : i * 16 + 16]
        if not use_qw:  # quantize_row_q3_K_ref
            for j in range(16):
                scales[j] = make_q3_quants(16, 4, xb[16 * j : 16 * j + 16], Lb[16 * j : 16 * j + 16])
            max_scale = absmax_signed(scales, 16)[1]
            if max_scale != _ZERO:
                iscale = _f(-32.0) / max_scale
                for j in range(16):
                    l8 = ((nearest_int(iscale * scales[j]) + 128) & 0xFF) - 128  # int8_t l = nearest_int(..)
                    Ls[j] = max(-32, min(31, l8)) + 32
                dall = put_f16(yb, 108, _ONE / iscale)
            else:  # all scale bytes stay 0
                dall = put_f16(yb, 108, _ZERO)
        else:  # quantize_row_q3_K_impl
            sigma2 = _f(2.0) * sum_sq(xb) / _f(256)
            _impl_weights(xb, qw[i * 256 : i * 256 + 256], sigma2, 16, weight, sw)
            for j in range(16):
                g = slice(16 * j, 16 * j + 16)
                scales[j] = make_qx_quants(16, 4, xb[g], Lb[g], weight[g], True, qxst)
            d_block = make_qx_quants(16, 32, scales, Ls, sw, True, qxst)
            dall = put_f16(yb, 108, d_block)
        for j in range(16):
            lv = np.int64(Ls[j]) if (use_qw or max_scale != _ZERO) else 0
            if j < 8:
                sc[j] = lv & 0xF
            else:
                sc[j - 8] = np.int64(sc[j - 8]) | ((lv & 0xF) << 4)
            lv >>= 4
            sc[j % 4 + 8] = np.int64(sc[j % 4 + 8]) | (lv << (2 * (j // 4)))
        for j in range(16):
            s6 = (np.int64(sc[j]) & 0xF) if j < 8 else (np.int64(sc[j - 8]) >> 4)
            s6 = (s6 | (((np.int64(sc[8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32
            d = dall * _f(s6)
            if d == _ZERO:
                continue
            for ii in range(16):
                Lb[16 * j + ii] = max(-4, min(3, nearest_int(xb[16 * j + ii] / d))) + 4
        # high bit of the 3-bit level (L > 3) into hmask: bit k of byte m for weight 32k + m
        hm = yb[0:32]
        for m in range(32):
            hm[m] = 0
        for k in range(8):
            for m in range(32):
                h = (np.int64(Lb[32 * k + m]) >> 2) & 1
                hm[m] = np.int64(hm[m]) | (h << k)
                Lb[32 * k + m] -= 4 * h
        _pack_2bit(Lb, yb[32:96])


@njit(cache=True, error_model="numpy")
def _q45_k_span(x, qw, use_qw, y, ncols, nmax):
    # Q4_K (nmax 15, 144-byte blocks) and Q5_K (nmax 31, 176-byte blocks) over a span of whole rows
    bs = 144 if nmax == 15 else 176
    nsb = x.size // 256
    weights = np.empty(x.size, np.float32)
    scales_all = np.empty(nsb * 8, np.float32)
    mins_all = np.empty(nsb * 8, np.float32)
    sw = np.empty(nsb * 8, np.float32)
    L = np.empty(x.size, np.uint8)
    Ls = np.empty(8, np.uint8)
    Lm = np.empty(8, np.uint8)
    for i in range(nsb):
        xb = x[i * 256 : i * 256 + 256]
        if not use_qw:  # quantize_row_q{4,5}_K_ref weights
            for j in range(8):
                xs = xb[32 * j : 32 * j + 32]
                av_x = np.sqrt(sum_sq(xs) / _f(32))
                for m in range(32):
                    weights[i * 256 + 32 * j + m] = av_x + abs(xs[m])
        else:  # quantize_row_q{4,5}_K_impl weights
            qo = (i % (ncols // 256)) * 256
            sigma2 = _f(2.0) * sum_sq(xb) / _f(256)
            _impl_weights(xb, qw[qo : qo + 256], sigma2, 32, weights[i * 256 :], sw[i * 8 :])
    if use_qw:
        qkx_groups(x, weights, 32, nmax, _f(-0.9), _f(0.05), 36, False, False, scales_all, mins_all, L)
    elif nmax == 15:
        qkx_groups(x, weights, 32, 15, _f(-1.0), _f(0.1), 20, False, True, scales_all, mins_all, L)
    else:
        qkx_groups(x, weights, 32, 31, _f(-0.5), _f(0.1), 15, False, True, scales_all, mins_all, L)
    for i in range(nsb):
        xb = x[i * 256 : i * 256 + 256]
        yb = y[i * bs : i * bs + bs]
        Lb = L[i * 256 : i * 256 + 256]
        sc = yb[4:16]
        scales = scales_all[i * 8 : i * 8 + 8]
        mins = mins_all[i * 8 : i * 8 + 8]
        if not use_qw:
            max_scale = _max0(scales)
            max_min = _max0(mins)
            inv_scale = _f(63.0) / max_scale if max_scale > _ZERO else _ZERO
            inv_min = _f(63.0) / max_min if max_min > _ZERO else _ZERO
            for j in range(8):
                Ls[j] = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
                Lm[j] = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
            d_block = max_scale / _f(63.0)
            m_block = max_min / _f(63.0)
        else:
            d_block = make_qp_quants(8, 63, scales, Ls, sw[i * 8 : i * 8 + 8])
            m_block = make_qp_quants(8, 63, mins, Lm, sw[i * 8 : i * 8 + 8])
        for j in range(8):
            ls = np.int64(Ls[j])
            lm = np.int64(Lm[j])
            if j < 4:
                sc[j] = ls
                sc[j + 4] = lm
            else:
                sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
                sc[j - 4] = np.int64(sc[j - 4]) | ((ls >> 4) << 6)
                sc[j] = np.int64(sc[j]) | ((lm >> 4) << 6)
        dd = put_f16(yb, 0, d_block)
        dmin = put_f16(yb, 2, m_block)
        for j in range(8):
            s6, m6 = scale_min_k4(j, sc)
            d = dd * _f(s6)
            if d == _ZERO:
                continue
            dm = dmin * _f(m6)
            for ii in range(32):
                Lb[32 * j + ii] = max(0, min(nmax, nearest_int((xb[32 * j + ii] + dm) / d)))
        if nmax == 15:
            for j in range(0, 256, 64):
                for m in range(32):
                    yb[16 + j // 2 + m] = np.int64(Lb[j + m]) | (np.int64(Lb[j + m + 32]) << 4)
        else:
            qh = yb[16:48]
            qh[:] = 0
            for n in range(0, 256, 64):
                b1 = 1 << (n // 32)
                b2 = 2 << (n // 32)
                for j in range(32):
                    l1 = np.int64(Lb[n + j])
                    if l1 > 15:
                        l1 -= 16
                        qh[j] = np.int64(qh[j]) | b1
                    l2 = np.int64(Lb[n + j + 32])
                    if l2 > 15:
                        l2 -= 16
                        qh[j] = np.int64(qh[j]) | b2
                    yb[48 + n // 2 + j] = l1 | (l2 << 4)


@njit(cache=True, error_model="numpy")
def _q6_k_row(x, qw, use_qw, y, ncols, nmax):
    qxst = np.empty((3, 19), np.float32)
    L = np.zeros(256, np.int8)
    scales = np.empty(16, np.float32)
    for i in range(x.size // 256):
        xb = x[i * 256 : i * 256 + 256]
        yb = y[i * 210 : i * 210 + 210]
        for ib in range(16):
            # quantize_row_q6_K_impl weighs by the raw quant_weights (an empty slice when there are none)
            xs = xb[16 * ib : 16 * ib + 16]
            scales[ib] = make_qx_quants(
                16, 32, xs, L[16 * ib : 16 * ib + 16], qw[i * 256 + 16 * ib :], use_qw, qxst
            )
        max_abs_scale, max_scale = absmax_signed(scales, 16)
        if max_abs_scale < _EPS:
            yb[:] = 0
            continue
        iscale = _f(-128.0) / max_scale
        dd = put_f16(yb, 208, _ONE / iscale)
        for ib in range(16):
            yb[192 + ib] = min(127, nearest_int(iscale * scales[ib])) & 0xFF
        for j in range(16):
            sv = np.int64(yb[192 + j])
            d = dd * _f(sv - 256 if sv > 127 else sv)
            if d == _ZERO:
                continue
            for ii in range(16):
                L[16 * j + ii] = max(-32, min(31, nearest_int(xb[16 * j + ii] / d))) + 32
        for j in range(0, 256, 128):
            for m in range(32):
                q1 = np.int64(L[j + m])
                q2 = np.int64(L[j + m + 32])
                q3 = np.int64(L[j + m + 64])
                q4 = np.int64(L[j + m + 96])
                yb[j // 2 + m] = (q1 & 0xF) | ((q3 & 0xF) << 4)
                yb[j // 2 + m + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
                yb[128 + j // 4 + m] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_q2_k(x, qw, nrows, ncols, out):
    quantize_rows(_q2_k_span, x, qw, nrows, ncols, out, 256, 84, span=_rows_per_span(ncols))


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_q3_k(x, qw, nrows, ncols, out):
    quantize_rows(_q3_k_row, x, qw, nrows, ncols, out, 256, 110)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_q4_k(x, qw, nrows, ncols, out):
    quantize_rows(_q45_k_span, x, qw, nrows, ncols, out, 256, 144, span=_rows_per_span(ncols), nmax=15)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_q5_k(x, qw, nrows, ncols, out):
    quantize_rows(_q45_k_span, x, qw, nrows, ncols, out, 256, 176, span=_rows_per_span(ncols), nmax=31)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_q6_k(x, qw, nrows, ncols, out):
    quantize_rows(_q6_k_row, x, qw, nrows, ncols, out, 256, 210)


class Q2_K(BlockFormat, qtype=GGMLQuantizationType.Q2_K):
    quantize_kernel = staticmethod(quantize_q2_k)
    quantize_ref = staticmethod(ref.quantize_q2_k)
    dequantize_kernel = staticmethod(dequantize_q2_k)
    dequantize_ref = staticmethod(ref.dequantize_q2_k)


class Q3_K(BlockFormat, qtype=GGMLQuantizationType.Q3_K):
    quantize_kernel = staticmethod(quantize_q3_k)
    quantize_ref = staticmethod(ref.quantize_q3_k)
    dequantize_kernel = staticmethod(dequantize_q3_k)
    dequantize_ref = staticmethod(ref.dequantize_q3_k)


class Q4_K(BlockFormat, qtype=GGMLQuantizationType.Q4_K):
    quantize_kernel = staticmethod(quantize_q4_k)
    quantize_ref = staticmethod(ref.quantize_q4_k)
    dequantize_kernel = staticmethod(dequantize_q4_k)
    dequantize_ref = staticmethod(ref.dequantize_q4_k)


class Q5_K(BlockFormat, qtype=GGMLQuantizationType.Q5_K):
    quantize_kernel = staticmethod(quantize_q5_k)
    quantize_ref = staticmethod(ref.quantize_q5_k)
    dequantize_kernel = staticmethod(dequantize_q5_k)
    dequantize_ref = staticmethod(ref.dequantize_q5_k)


class Q6_K(BlockFormat, qtype=GGMLQuantizationType.Q6_K):
    quantize_kernel = staticmethod(quantize_q6_k)
    quantize_ref = staticmethod(ref.quantize_q6_k)
    dequantize_kernel = staticmethod(dequantize_q6_k)
    dequantize_ref = staticmethod(ref.dequantize_q6_k)
