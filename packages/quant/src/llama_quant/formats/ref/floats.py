"""Numpy references of the F32 / F16 / BF16 kernels."""

from __future__ import annotations

import numpy as np

from llama_quant.formats.ref.common import f16_bits

__all__ = [
    "dequantize_bf16",
    "dequantize_f16",
    "dequantize_f32",
    "quantize_bf16",
    "quantize_f16",
    "quantize_f32",
]


def quantize_f32(x, qw, nrows, ncols, out):
    out.view(np.float32)[: nrows * ncols] = x[: nrows * ncols]


def dequantize_f32(raw, n, out):
    out[:n] = raw.view(np.float32)[:n]


def quantize_f16(x, qw, nrows, ncols, out):
    out.view(np.uint16)[: nrows * ncols] = f16_bits(x[: nrows * ncols])


def dequantize_f16(raw, n, out):
    out[:n] = raw.view(np.float16)[:n].astype(np.float32)


def quantize_bf16(x, qw, nrows, ncols, out):
    # same as ggml_compute_fp32_to_bf16: NaN forced quiet, else round to nearest even
    u = x[: nrows * ncols].view(np.uint32).astype(np.uint64)
    rounded = (u + (0x7FFF + ((u >> np.uint64(16)) & np.uint64(1)))) >> np.uint64(16)
    nan = (u & np.uint64(0x7FFFFFFF)) > np.uint64(0x7F800000)
    out.view(np.uint16)[: nrows * ncols] = np.where(
        nan, (u >> np.uint64(16)) | np.uint64(64), rounded
    ).astype(np.uint16)


def dequantize_bf16(raw, n, out):
    out.view(np.uint32)[:n] = raw.view(np.uint16)[:n].astype(np.uint32) << np.uint32(16)
