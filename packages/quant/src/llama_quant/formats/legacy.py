# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""The 32-weight legacy formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Quantize follows ggml_quantize_chunk: without importance weights quantize_row_q*_ref, with them
quantize_row_q*_impl (Q8_0 ignores them). Block layouts (ggml-common.h), little-endian:
  Q4_0 {f16 d; u8 qs[16]}            Q4_1 {f16 d, m; u8 qs[16]}
  Q5_0 {f16 d; u32 qh; u8 qs[16]}     Q5_1 {f16 d, m; u32 qh; u8 qs[16]}
  Q8_0 {f16 d; i8 qs[32]}
Dequantize mirrors gguf-py's float32 expressions (``d * q`` or ``d * q + m``).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit

from llama_quant.formats.common import (
    absmax_signed,
    get_f16,
    make_qx_quants,
    put_f16,
    qkx_groups,
    roundf,
    sum_sq,
)
from llama_quant.formats.drivers import dequantize_blocks, quantize_blocks, quantize_rows
from llama_quant.formats.ref import legacy as ref
from llama_quant.registry import BlockFormat

__all__ = [
    "dequantize_q4_0",
    "dequantize_q4_1",
    "dequantize_q5_0",
    "dequantize_q5_1",
    "dequantize_q8_0",
    "quantize_q4_0",
    "quantize_q4_1",
    "quantize_q5_0",
    "quantize_q5_1",
    "quantize_q8_0",
]

_f = np.float32
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_FLT_MAX = np.float32(3.4028234663852886e38)
_RMIN = np.float32(-0.9)
_RDELTA = np.float32(0.05)


@njit(cache=True, inline="always", error_model="numpy")
def _put_u32(out, pos, v):
    for k in range(4):
        out[pos + k] = (v >> (8 * k)) & 0xFF


@njit(cache=True, error_model="numpy")
def _sigma2(x):
    # sum(x^2)/n_per_row in float32, sequential like the C loop
    return sum_sq(x) / _f(x.size)


@njit(cache=True, error_model="numpy")
def _weights(xb, qwb, sigma2, weight):
    # weight[j] = qw[j] * sqrtf(sigma2 + x[j]*x[j])
    for j in range(xb.size):
        weight[j] = qwb[j] * np.sqrt(sigma2 + xb[j] * xb[j])


@njit(cache=True, inline="always", error_model="numpy")
def _pack_32(yb, pos, L, five):
    # the 32 levels of a block at yb[pos:]: nibble pairs (L[j], L[j + 16]); with five, the u32 of fifth bits first
    if not five:
        for j in range(16):
            yb[pos + j] = np.int64(np.uint8(L[j])) | (np.int64(np.uint8(L[j + 16])) << 4)
        return
    qh = 0
    for j in range(16):
        xi0 = np.int64(np.uint8(L[j]))
        xi1 = np.int64(np.uint8(L[j + 16]))
        yb[pos + 4 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4)
        qh |= ((xi0 & 0x10) >> 4) << j
        qh |= ((xi1 & 0x10) >> 4) << (j + 16)
    _put_u32(yb, pos, qh)


@njit(cache=True, inline="always", error_model="numpy")
def _q_0_row(x, qw, use_qw, y, ncols, nmax):
    # Q4_0 (nmax 8) and Q5_0 (nmax 16): quantize_row_q{4,5}_0_ref / _impl
    bs = 18 if nmax == 8 else 22
    L = np.empty(32, np.int8)
    weight = np.empty(32, np.float32)
    qxst = np.empty((3, 19), np.float32)
    sigma2 = _sigma2(x) if use_qw else _ZERO
    offset = _f(nmax) + _f(0.5)  # 8.5 or 16.5, exact
    for ib in range(x.size // 32):
        xb = x[ib * 32 : ib * 32 + 32]
        yb = y[ib * bs : ib * bs + bs]
        if use_qw:
            _weights(xb, qw[ib * 32 : ib * 32 + 32], sigma2, weight)
            d = make_qx_quants(32, nmax, xb, L, weight, True, qxst)
        else:
            d = absmax_signed(xb, 32)[1] / _f(-nmax)
            idd = _ONE / d if d != _ZERO else _ZERO
            for j in range(32):
                L[j] = min(2 * nmax - 1, np.int64(xb[j] * idd + offset))
        put_f16(yb, 0, d)
        _pack_32(yb, 2, L, nmax == 16)


@njit(cache=True, inline="always", error_model="numpy")
def _q_1_row(x, qw, use_qw, y, ncols, nmax):
    # Q4_1 (nmax 15) and Q5_1 (nmax 31): quantize_row_q{4,5}_1_ref / _impl
    bs = 20 if nmax == 15 else 24
    nb = x.size // 32
    dq = np.empty(nb, np.float32)
    mq = np.empty(nb, np.float32)
    L = np.empty(x.size, np.uint8)
    if use_qw:
        # _impl: make_qkx3_quants per block, all blocks of the row side by side
        weight = np.empty(x.size, np.float32)
        sigma2 = _sigma2(x)
        for ib in range(nb):
            _weights(
                x[ib * 32 : ib * 32 + 32], qw[ib * 32 : ib * 32 + 32], sigma2, weight[ib * 32 : ib * 32 + 32]
            )
        qkx_groups(x, weight, 32, nmax, _RMIN, _RDELTA, 36, False, False, dq, mq, L)
        for ib in range(nb):
            mq[ib] = -mq[ib]
    else:
        for ib in range(nb):
            xb = x[ib * 32 : ib * 32 + 32]
            vmin = _FLT_MAX
            vmax = -_FLT_MAX
            for j in range(32):
                v = xb[j]
                if v < vmin:
                    vmin = v
                if v > vmax:
                    vmax = v
            d = (vmax - vmin) / _f(nmax)
            idd = _ONE / d if d != _ZERO else _ZERO
            dq[ib] = d
            mq[ib] = vmin
            for j in range(32):
                q = np.int64((xb[j] - vmin) * idd + _f(0.5))
                L[ib * 32 + j] = min(15, q) if nmax == 15 else q
    for ib in range(nb):
        yb = y[ib * bs : ib * bs + bs]
        Lb = L[ib * 32 : ib * 32 + 32]
        put_f16(yb, 0, dq[ib])
        put_f16(yb, 2, mq[ib])
        _pack_32(yb, 4, Lb, nmax == 31)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_q4_0(x, qw, nrows, ncols, out):
    quantize_rows(_q_0_row, x, qw, nrows, ncols, out, 32, 18, nmax=8)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_q4_1(x, qw, nrows, ncols, out):
    quantize_rows(_q_1_row, x, qw, nrows, ncols, out, 32, 20, nmax=15)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_q5_0(x, qw, nrows, ncols, out):
    quantize_rows(_q_0_row, x, qw, nrows, ncols, out, 32, 22, nmax=16)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_q5_1(x, qw, nrows, ncols, out):
    quantize_rows(_q_1_row, x, qw, nrows, ncols, out, 32, 24, nmax=31)


@njit(cache=True, inline="always", error_model="numpy")
def _q8_0_block(xb, yb):
    amax = _ZERO
    for j in range(32):
        a = abs(xb[j])
        amax = amax if amax > a else a  # MAX(amax, fabsf(v)), NaN-order as in C
    d = amax / _f(127)
    idd = _ONE / d if d != _ZERO else _ZERO
    put_f16(yb, 0, d)
    for j in range(32):
        yb[2 + j] = np.uint8(np.int8(np.int64(roundf(xb[j] * idd))))


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_q8_0(x, qw, nrows, ncols, out):
    quantize_blocks(_q8_0_block, x, nrows, ncols, out, 32, 34)


@njit(cache=True, inline="always", error_model="numpy")
def _dq_q4_0(b, y):
    d = get_f16(b, 0)
    for j in range(16):
        q = np.int64(b[2 + j])
        y[j] = d * _f((q & 0x0F) - 8)
        y[j + 16] = d * _f((q >> 4) - 8)


@njit(cache=True, inline="always", error_model="numpy")
def _dq_q4_1(b, y):
    d = get_f16(b, 0)
    m = get_f16(b, 2)
    for j in range(16):
        q = np.int64(b[4 + j])
        y[j] = d * _f(q & 0x0F) + m
        y[j + 16] = d * _f(q >> 4) + m


@njit(cache=True, inline="always", error_model="numpy")
def _dq_q5_0(b, y):
    d = get_f16(b, 0)
    qh = np.int64(b[2]) | (np.int64(b[3]) << 8) | (np.int64(b[4]) << 16) | (np.int64(b[5]) << 24)
    for j in range(16):
        q = np.int64(b[6 + j])
        h0 = (qh >> j) & 1
        h1 = (qh >> (j + 16)) & 1
        y[j] = d * _f(((q & 0x0F) | (h0 << 4)) - 16)
        y[j + 16] = d * _f(((q >> 4) | (h1 << 4)) - 16)


@njit(cache=True, inline="always", error_model="numpy")
def _dq_q5_1(b, y):
    d = get_f16(b, 0)
    m = get_f16(b, 2)
    qh = np.int64(b[4]) | (np.int64(b[5]) << 8) | (np.int64(b[6]) << 16) | (np.int64(b[7]) << 24)
    for j in range(16):
        q = np.int64(b[8 + j])
        h0 = (qh >> j) & 1
        h1 = (qh >> (j + 16)) & 1
        y[j] = d * _f((q & 0x0F) | (h0 << 4)) + m
        y[j + 16] = d * _f((q >> 4) | (h1 << 4)) + m


@njit(cache=True, inline="always", error_model="numpy")
def _dq_q8_0(b, y):
    d = get_f16(b, 0)
    for j in range(32):
        y[j] = _f(np.int8(b[2 + j])) * d


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_q4_0(raw, n, out):
    dequantize_blocks(_dq_q4_0, raw, n, out, 32, 18)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_q4_1(raw, n, out):
    dequantize_blocks(_dq_q4_1, raw, n, out, 32, 20)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_q5_0(raw, n, out):
    dequantize_blocks(_dq_q5_0, raw, n, out, 32, 22)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_q5_1(raw, n, out):
    dequantize_blocks(_dq_q5_1, raw, n, out, 32, 24)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_q8_0(raw, n, out):
    dequantize_blocks(_dq_q8_0, raw, n, out, 32, 34)


class Q4_0(BlockFormat, qtype=GGMLQuantizationType.Q4_0):
    quantize_kernel = staticmethod(quantize_q4_0)
    quantize_ref = staticmethod(ref.quantize_q4_0)
    dequantize_kernel = staticmethod(dequantize_q4_0)
    dequantize_ref = staticmethod(ref.dequantize_q4_0)


class Q4_1(BlockFormat, qtype=GGMLQuantizationType.Q4_1):
    quantize_kernel = staticmethod(quantize_q4_1)
    quantize_ref = staticmethod(ref.quantize_q4_1)
    dequantize_kernel = staticmethod(dequantize_q4_1)
    dequantize_ref = staticmethod(ref.dequantize_q4_1)


class Q5_0(BlockFormat, qtype=GGMLQuantizationType.Q5_0):
    quantize_kernel = staticmethod(quantize_q5_0)
    quantize_ref = staticmethod(ref.quantize_q5_0)
    dequantize_kernel = staticmethod(dequantize_q5_0)
    dequantize_ref = staticmethod(ref.dequantize_q5_0)


class Q5_1(BlockFormat, qtype=GGMLQuantizationType.Q5_1):
    quantize_kernel = staticmethod(quantize_q5_1)
    quantize_ref = staticmethod(ref.quantize_q5_1)
    dequantize_kernel = staticmethod(dequantize_q5_1)
    dequantize_ref = staticmethod(ref.dequantize_q5_1)


class Q8_0(BlockFormat, qtype=GGMLQuantizationType.Q8_0):
    quantize_kernel = staticmethod(quantize_q8_0)
    quantize_ref = staticmethod(ref.quantize_q8_0)
    dequantize_kernel = staticmethod(dequantize_q8_0)
    dequantize_ref = staticmethod(ref.dequantize_q8_0)
