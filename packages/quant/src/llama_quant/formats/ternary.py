# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""The ternary formats TQ1_0 (1.6875 bpw, base-3 packing) and TQ2_0 (2 bits per weight).

quantize_row_tq{1,2}_0_ref (importance weights are ignored by llama.cpp). Block layouts:
  TQ1_0 {u8 qs[48]; u8 qh[4]; f16 d}   54 bytes
  TQ2_0 {u8 qs[64]; f16 d}             66 bytes
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit

from llama_quant.formats.common import get_f16, lroundf, put_f16
from llama_quant.formats.drivers import dequantize_blocks, quantize_blocks
from llama_quant.formats.ref import ternary as ref
from llama_quant.registry import BlockFormat

__all__ = ["dequantize_tq1_0", "dequantize_tq2_0", "quantize_tq1_0", "quantize_tq2_0"]

_f = np.float32
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_POW3 = np.array([1, 3, 9, 27, 81, 243], dtype=np.int64)


@njit(cache=True, inline="always", error_model="numpy")
def _absmax_scale(xb, yb, pos):
    amax = _ZERO
    for j in range(256):
        a = abs(xb[j])
        amax = amax if amax > a else a  # MAX(amax, fabsf(v)), NaN-order as in C
    put_f16(yb, pos, amax)
    return _ONE / amax if amax != _ZERO else _ZERO


@njit(cache=True, inline="always", error_model="numpy")
def _trits(xb, idd, start, stride, count, extra):
    # base-3 digits of count weights, most significant first, then the 256/243 ceiling scaling
    # uint8_t q; q *= 3; q += xi; with int xi = lroundf(..) + 1 (wraps like the C types; only garbage input wraps)
    q = 0
    for k in range(count):
        xi = (lroundf(xb[start + k * stride] * idd) + 1) & 0xFFFFFFFF
        q = ((q * 3) + xi) & 0xFF
    q = (q * extra) & 0xFF
    return (q * 256 + 242) // 243


@njit(cache=True, error_model="numpy")
def _tq1_0_block(xb, yb):
    idd = _absmax_scale(xb, yb, 52)
    for m in range(32):
        yb[m] = _trits(xb, idd, m, 32, 5, 1)
    for m in range(16):
        yb[32 + m] = _trits(xb, idd, 160 + m, 16, 5, 1)
    for j in range(4):
        yb[48 + j] = _trits(xb, idd, 240 + j, 4, 4, 3)


@njit(cache=True, error_model="numpy")
def _tq2_0_block(xb, yb):
    idd = _absmax_scale(xb, yb, 64)
    for j in range(0, 64, 32):
        for m in range(32):
            q = 0
            for n in range(4):
                q += ((lroundf(xb[4 * j + m + 32 * n] * idd) + 1) & 3) << (2 * n)
            yb[j + m] = q


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_tq1_0(x, qw, nrows, ncols, out):
    quantize_blocks(_tq1_0_block, x, nrows, ncols, out, 256, 54)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_tq2_0(x, qw, nrows, ncols, out):
    quantize_blocks(_tq2_0_block, x, nrows, ncols, out, 256, 66)


@njit(cache=True, inline="always", error_model="numpy")
def _trit(byte, k):
    # digit k of a packed byte: ((uint8)(byte * 3^k) * 3) >> 8, minus 1
    return (((np.int64(byte) * _POW3[k]) & 0xFF) * 3 >> 8) - 1


@njit(cache=True, error_model="numpy")
def _dq_tq1_0(b, y):
    d = get_f16(b, 52)
    for k in range(5):
        for m in range(32):
            y[32 * k + m] = d * _f(_trit(b[m], k))
        for m in range(16):
            y[160 + 16 * k + m] = d * _f(_trit(b[32 + m], k))
    for k in range(4):
        for m in range(4):
            y[240 + 4 * k + m] = d * _f(_trit(b[48 + m], k))


@njit(cache=True, error_model="numpy")
def _dq_tq2_0(b, y):
    d = get_f16(b, 64)
    for p in range(256):
        h, r = divmod(p, 128)
        y[p] = d * _f(((np.int64(b[32 * h + r % 32]) >> (2 * (r // 32))) & 3) - 1)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_tq1_0(raw, n, out):
    dequantize_blocks(_dq_tq1_0, raw, n, out, 256, 54)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_tq2_0(raw, n, out):
    dequantize_blocks(_dq_tq2_0, raw, n, out, 256, 66)


class TQ1_0(BlockFormat, qtype=GGMLQuantizationType.TQ1_0):
    quantize_kernel = staticmethod(quantize_tq1_0)
    quantize_ref = staticmethod(ref.quantize_tq1_0)
    dequantize_kernel = staticmethod(dequantize_tq1_0)
    dequantize_ref = staticmethod(ref.dequantize_tq1_0)


class TQ2_0(BlockFormat, qtype=GGMLQuantizationType.TQ2_0):
    quantize_kernel = staticmethod(quantize_tq2_0)
    quantize_ref = staticmethod(ref.quantize_tq2_0)
    dequantize_kernel = staticmethod(dequantize_tq2_0)
    dequantize_ref = staticmethod(ref.dequantize_tq2_0)
