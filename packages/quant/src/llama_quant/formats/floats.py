# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""Plain float formats: F32, F16, BF16 (ggml_fp32_to_fp16_row / ggml_fp32_to_bf16_row_ref)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit, prange

from llama_quant.formats.common import F16_TO_F32, f32_to_f16
from llama_quant.formats.ref import floats as ref
from llama_quant.registry import BlockFormat

__all__ = [
    "dequantize_bf16",
    "dequantize_f16",
    "dequantize_f32",
    "quantize_bf16",
    "quantize_f16",
    "quantize_f32",
]

_CHUNK = 1 << 16  # elements per parallel chunk


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_f32(x, qw, nrows, ncols, out):
    # out: uint8[n * 4], the float32 bytes as they are
    n = nrows * ncols
    o = out.view(np.float32)
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            o[i] = x[i]


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_f32(raw, n, out):
    v = raw.view(np.float32)
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            out[i] = v[i]


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_f16(x, qw, nrows, ncols, out):
    n = nrows * ncols
    o = out.view(np.uint16)
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            o[i] = f32_to_f16(x[i])


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_f16(raw, n, out):
    h = raw.view(np.uint16)
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            out[i] = F16_TO_F32[h[i]]


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_bf16(x, qw, nrows, ncols, out):
    # ggml_compute_fp32_to_bf16: round to nearest even, NaN forced quiet
    n = nrows * ncols
    u = x.view(np.uint32)
    o = out.view(np.uint16)
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            w = np.int64(u[i])
            if (w & 0x7FFFFFFF) > 0x7F800000:
                o[i] = np.uint16((w >> 16) | 64)
            else:
                o[i] = np.uint16((w + (0x7FFF + ((w >> 16) & 1))) >> 16)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_bf16(raw, n, out):
    h = raw.view(np.uint16)
    o = out.view(np.uint32)
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            o[i] = np.int64(h[i]) << 16


class F32(BlockFormat, qtype=GGMLQuantizationType.F32):
    quantize_kernel = staticmethod(quantize_f32)
    quantize_ref = staticmethod(ref.quantize_f32)
    dequantize_kernel = staticmethod(dequantize_f32)
    dequantize_ref = staticmethod(ref.dequantize_f32)


class F16(BlockFormat, qtype=GGMLQuantizationType.F16):
    quantize_kernel = staticmethod(quantize_f16)
    quantize_ref = staticmethod(ref.quantize_f16)
    dequantize_kernel = staticmethod(dequantize_f16)
    dequantize_ref = staticmethod(ref.dequantize_f16)


class BF16(BlockFormat, qtype=GGMLQuantizationType.BF16):
    quantize_kernel = staticmethod(quantize_bf16)
    quantize_ref = staticmethod(ref.quantize_bf16)
    dequantize_kernel = staticmethod(dequantize_bf16)
    dequantize_ref = staticmethod(ref.dequantize_bf16)
