# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""Dequantization of the grid-based i-quants IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S.

Each kernel evaluates gguf-py's float32 expressions (``db * grid * sign`` or ``dl * (grid + delta)``) so
the result is bit-identical to ``gguf.quants.dequantize``. The quantizers are in iq1_quant, iq2_quant and
iq3_quant.
Block layouts (ggml-common.h), all 256 weights:
  IQ2_XXS {f16 d; u16 qs[32]}                                   66 bytes
  IQ2_XS  {f16 d; u16 qs[32]; u8 scales[8]}                     74 bytes
  IQ2_S   {f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]}   82 bytes
  IQ3_XXS {f16 d; u8 qs[64]; u32 scales_and_signs[8]}           98 bytes
  IQ3_S   {f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]}   110 bytes
  IQ1_S   {f16 d; u8 qs[32]; u16 qh[8]}                         50 bytes
  IQ1_M   {u8 qs[32]; u8 qh[16]; u16 scales[4] (f16 d in their top nibbles)}   56 bytes
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit

from llama_quant.formats import iq1_quant, iq2_quant, iq3_quant
from llama_quant.formats.common import F16_TO_F32
from llama_quant.formats.drivers import dequantize_blocks
from llama_quant.formats.grids import (
    IQ1S_DELTA,
    IQ1S_GRID,
    IQ2S_GRID,
    IQ2XS_GRID,
    IQ2XXS_GRID,
    IQ3S_GRID,
    IQ3XXS_GRID,
    KSIGNS_IQ2XS,
)
from llama_quant.formats.ref import igrid as qref
from llama_quant.formats.ref import iquants as ref
from llama_quant.registry import BlockFormat

__all__ = [
    "dequantize_iq1_m",
    "dequantize_iq1_s",
    "dequantize_iq2_s",
    "dequantize_iq2_xs",
    "dequantize_iq2_xxs",
    "dequantize_iq3_s",
    "dequantize_iq3_xxs",
]

_f = np.float32
_HALF = np.float32(0.5)
_QUARTER = np.float32(0.25)
_ONE = np.float32(1.0)


@njit(cache=True, inline="always", error_model="numpy")
def _u16(b, pos):
    return np.int64(b[pos]) | (np.int64(b[pos + 1]) << 8)


@njit(cache=True, inline="always", error_model="numpy")
def _u32(b, pos):
    return _u16(b, pos) | (_u16(b, pos + 2) << 16)


@njit(cache=True, inline="always", error_model="numpy")
def _signed(v, bits, j):
    # v * (bit j of bits ? -1 : 1) as numpy computes it: a NaN keeps its sign (LLVM would fold the
    # multiply into a negation, which flips it)
    if (bits >> j) & 1 and not np.isnan(v):
        return -v
    return v


@njit(cache=True, error_model="numpy")
def _dq_iq2_xxs(b, y):
    d = F16_TO_F32[_u16(b, 0)]
    for ib in range(8):
        w0 = _u32(b, 2 + 8 * ib)
        w1 = _u32(b, 6 + 8 * ib)
        db = d * (_HALF + _f(w1 >> 28)) * _QUARTER
        for m in range(4):
            g = IQ2XXS_GRID[(w0 >> (8 * m)) & 0xFF]
            s = np.int64(KSIGNS_IQ2XS[(w1 >> (7 * m)) & 127])
            for j in range(8):
                y[32 * ib + 8 * m + j] = _signed(db * g[j], s, j)


@njit(cache=True, error_model="numpy")
def _dq_iq2_xs(b, y):
    d = F16_TO_F32[_u16(b, 0)]
    for e in range(32):
        k = e // 2
        sc = (np.int64(b[66 + k // 2]) >> (4 * (k % 2))) & 0xF
        db = d * (_HALF + _f(sc)) * _QUARTER
        q = _u16(b, 2 + 2 * e)
        g = IQ2XS_GRID[q & 511]
        s = np.int64(KSIGNS_IQ2XS[q >> 9])
        for j in range(8):
            y[8 * e + j] = _signed(db * g[j], s, j)


@njit(cache=True, error_model="numpy")
def _dq_iq2_s(b, y):
    d = F16_TO_F32[_u16(b, 0)]
    for e in range(32):
        k = e // 2
        sc = (np.int64(b[74 + k // 2]) >> (4 * (k % 2))) & 0xF
        db = d * (_HALF + _f(sc)) * _QUARTER
        idx = np.int64(b[2 + e]) | (((np.int64(b[66 + e // 4]) >> (2 * (e % 4))) & 3) << 8)
        g = IQ2S_GRID[idx]
        s = np.int64(b[34 + e])
        for j in range(8):
            y[8 * e + j] = _signed(db * g[j], s, j)


@njit(cache=True, error_model="numpy")
def _dq_iq3_xxs(b, y):
    d = F16_TO_F32[_u16(b, 0)]
    for ib in range(8):
        w = _u32(b, 66 + 4 * ib)
        db = d * (_HALF + _f(w >> 28)) * _HALF
        for m in range(4):
            s = np.int64(KSIGNS_IQ2XS[(w >> (7 * m)) & 127])
            for j in range(8):
                g = IQ3XXS_GRID[np.int64(b[2 + 8 * ib + 2 * m + j // 4])]
                y[32 * ib + 8 * m + j] = _signed(db * g[j % 4], s, j)


@njit(cache=True, error_model="numpy")
def _dq_iq3_s(b, y):
    d = F16_TO_F32[_u16(b, 0)]
    for ib in range(8):
        sc = (np.int64(b[106 + ib // 2]) >> (4 * (ib % 2))) & 0xF
        db = d * _f(1 + 2 * sc)
        for e in range(8 * ib, 8 * ib + 8):
            idx = np.int64(b[2 + e]) | (((np.int64(b[66 + e // 8]) >> (e % 8)) & 1) << 8)
            g = IQ3S_GRID[idx]
            for j in range(4):
                p = 4 * e + j
                y[p] = _signed(db * g[j], np.int64(b[74 + p // 8]), p % 8)


@njit(cache=True, error_model="numpy")
def _dq_iq1_s(b, y):
    d = F16_TO_F32[_u16(b, 0)]
    for ib in range(8):
        qh = _u16(b, 34 + 2 * ib)
        dl = d * _f(2 * ((qh >> 12) & 7) + 1)
        delta = -IQ1S_DELTA if qh & 0x8000 else IQ1S_DELTA
        for m in range(4):
            g = IQ1S_GRID[np.int64(b[2 + 4 * ib + m]) | (((qh >> (3 * m)) & 7) << 8)]
            for j in range(8):
                y[32 * ib + 8 * m + j] = dl * (g[j] + delta)


@njit(cache=True, error_model="numpy")
def _dq_iq1_m(b, y):
    s0 = _u16(b, 48)
    s1 = _u16(b, 50)
    s2 = _u16(b, 52)
    s3 = _u16(b, 54)
    d = F16_TO_F32[(s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000)]
    for k in range(16):
        sw = _u16(b, 48 + 2 * (k // 4))
        dl = d * _f(2 * ((sw >> (3 * (k % 4))) & 7) + 1)
        for t in range(2):
            e = 2 * k + t
            qh = (np.int64(b[32 + e // 2]) >> (4 * (e % 2))) & 0xF
            g = IQ1S_GRID[np.int64(b[e]) | ((qh & 7) << 8)]
            delta = -IQ1S_DELTA if qh & 0x08 else IQ1S_DELTA
            for j in range(8):
                y[8 * e + j] = dl * (g[j] + delta)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_iq2_xxs(raw, n, out):
    dequantize_blocks(_dq_iq2_xxs, raw, n, out, 256, 66)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_iq2_xs(raw, n, out):
    dequantize_blocks(_dq_iq2_xs, raw, n, out, 256, 74)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_iq2_s(raw, n, out):
    dequantize_blocks(_dq_iq2_s, raw, n, out, 256, 82)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_iq3_xxs(raw, n, out):
    dequantize_blocks(_dq_iq3_xxs, raw, n, out, 256, 98)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_iq3_s(raw, n, out):
    dequantize_blocks(_dq_iq3_s, raw, n, out, 256, 110)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_iq1_s(raw, n, out):
    dequantize_blocks(_dq_iq1_s, raw, n, out, 256, 50)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_iq1_m(raw, n, out):
    dequantize_blocks(_dq_iq1_m, raw, n, out, 256, 56)


class IQ2_XXS(BlockFormat, qtype=GGMLQuantizationType.IQ2_XXS):
    requires_imatrix = True
    quantize_kernel = staticmethod(iq2_quant.quantize_iq2_xxs)
    quantize_ref = staticmethod(qref.quantize_iq2_xxs)
    dequantize_kernel = staticmethod(dequantize_iq2_xxs)
    dequantize_ref = staticmethod(ref.dequantize_iq2_xxs)


class IQ2_XS(BlockFormat, qtype=GGMLQuantizationType.IQ2_XS):
    requires_imatrix = True
    quantize_kernel = staticmethod(iq2_quant.quantize_iq2_xs)
    quantize_ref = staticmethod(qref.quantize_iq2_xs)
    dequantize_kernel = staticmethod(dequantize_iq2_xs)
    dequantize_ref = staticmethod(ref.dequantize_iq2_xs)


class IQ2_S(BlockFormat, qtype=GGMLQuantizationType.IQ2_S):
    quantize_kernel = staticmethod(iq2_quant.quantize_iq2_s)
    quantize_ref = staticmethod(qref.quantize_iq2_s)
    dequantize_kernel = staticmethod(dequantize_iq2_s)
    dequantize_ref = staticmethod(ref.dequantize_iq2_s)


class IQ3_XXS(BlockFormat, qtype=GGMLQuantizationType.IQ3_XXS):
    quantize_kernel = staticmethod(iq3_quant.quantize_iq3_xxs)
    quantize_ref = staticmethod(qref.quantize_iq3_xxs)
    dequantize_kernel = staticmethod(dequantize_iq3_xxs)
    dequantize_ref = staticmethod(ref.dequantize_iq3_xxs)


class IQ3_S(BlockFormat, qtype=GGMLQuantizationType.IQ3_S):
    quantize_kernel = staticmethod(iq3_quant.quantize_iq3_s)
    quantize_ref = staticmethod(qref.quantize_iq3_s)
    dequantize_kernel = staticmethod(dequantize_iq3_s)
    dequantize_ref = staticmethod(ref.dequantize_iq3_s)


class IQ1_S(BlockFormat, qtype=GGMLQuantizationType.IQ1_S):
    requires_imatrix = True
    quantize_kernel = staticmethod(iq1_quant.quantize_iq1_s)
    quantize_ref = staticmethod(qref.quantize_iq1_s)
    dequantize_kernel = staticmethod(dequantize_iq1_s)
    dequantize_ref = staticmethod(ref.dequantize_iq1_s)


class IQ1_M(BlockFormat, qtype=GGMLQuantizationType.IQ1_M):
    quantize_kernel = staticmethod(iq1_quant.quantize_iq1_m)
    quantize_ref = staticmethod(qref.quantize_iq1_m)
    dequantize_kernel = staticmethod(dequantize_iq1_m)
    dequantize_ref = staticmethod(ref.dequantize_iq1_m)
