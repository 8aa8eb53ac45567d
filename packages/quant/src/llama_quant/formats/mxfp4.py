# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""The fp4 (e2m1) formats.

MXFP4: 32 weights sharing one e8m0 exponent (quantize_row_mxfp4_ref). Block {u8 e; u8 qs[16]}, 17 bytes.
NVFP4: 64 weights in 4 sub-blocks of 16, each with a ue4m3 scale. Block {u8 d[4]; u8 qs[32]}, 36 bytes
(dequantize only).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit

from llama_quant.formats.common import f32_from_bits
from llama_quant.formats.drivers import dequantize_blocks, quantize_blocks
from llama_quant.formats.ref import mxfp4 as ref
from llama_quant.registry import BlockFormat

__all__ = ["KVALUES_MXFP4", "UE4M3_TO_F32_HALF", "dequantize_mxfp4", "dequantize_nvfp4", "quantize_mxfp4"]

# kvalues_mxfp4: e2m1 values doubled (ggml-common.h)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)

_f = np.float32
_ZERO = np.float32(0.0)


def _ue4m3_table() -> np.ndarray:
    # ggml_ue4m3_to_fp32 (value * 0.5) for every byte, evaluated with gguf-py's float32 expression
    x = np.arange(256, dtype=np.uint8)
    exp = (x >> 3).astype(np.int32) & 0xF
    man = (x & 0x7).astype(np.float32)
    raw = np.where(exp == 0, man * 2**-9, (1.0 + man / 8.0) * (2.0 ** (exp.astype(np.float32) - 7)))
    return np.where((x == 0) | (x == 0x7F), 0.0, raw * 0.5).astype(np.float32)


UE4M3_TO_F32_HALF: np.ndarray = _ue4m3_table()


@njit(cache=True, inline="always", error_model="numpy")
def _e8m0_half(e):
    # ggml_e8m0_to_fp32_half: 2**(e - 128) as float32 bits, denormal for e < 2
    bits = (0x00200000 << e) if e < 2 else ((e - 1) << 23)
    return f32_from_bits(np.uint32(bits))


@njit(cache=True, inline="always", error_model="numpy")
def _best_index(x, d):
    best = 0
    best_err = abs(_f(KVALUES_MXFP4[0]) * d - x)
    for i in range(1, 16):
        err = abs(_f(KVALUES_MXFP4[i]) * d - x)
        if err < best_err:
            best = i
            best_err = err
    return best


@njit(cache=True, inline="always", error_model="numpy")
def _mxfp4_block(xb, yb):
    amax = _ZERO
    for j in range(32):
        if amax < abs(xb[j]):
            amax = abs(xb[j])
    e = np.int64(np.floor(np.log2(amax)) - _f(2.0) + _f(127.0)) & 0xFF if amax > _ZERO else 0
    d = _e8m0_half(e)
    yb[0] = e
    for j in range(16):
        yb[1 + j] = _best_index(xb[j], d) | (_best_index(xb[j + 16], d) << 4)


@njit(cache=True, parallel=True, error_model="numpy")
def quantize_mxfp4(x, qw, nrows, ncols, out):
    quantize_blocks(_mxfp4_block, x, nrows, ncols, out, 32, 17)


@njit(cache=True, inline="always", error_model="numpy")
def _dq_mxfp4(b, y):
    d = _e8m0_half(np.int64(b[0]))
    for j in range(16):
        q = np.int64(b[1 + j])
        y[j] = d * _f(KVALUES_MXFP4[q & 0xF])
        y[j + 16] = d * _f(KVALUES_MXFP4[q >> 4])


@njit(cache=True, inline="always", error_model="numpy")
def _dq_nvfp4(b, y):
    for sb in range(4):
        d = UE4M3_TO_F32_HALF[np.int64(b[sb])]
        for j in range(8):
            q = np.int64(b[4 + 8 * sb + j])
            y[16 * sb + j] = d * _f(KVALUES_MXFP4[q & 0xF])
            y[16 * sb + j + 8] = d * _f(KVALUES_MXFP4[q >> 4])


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_mxfp4(raw, n, out):
    dequantize_blocks(_dq_mxfp4, raw, n, out, 32, 17)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_nvfp4(raw, n, out):
    dequantize_blocks(_dq_nvfp4, raw, n, out, 64, 36)


class MXFP4(BlockFormat, qtype=GGMLQuantizationType.MXFP4):
    quantize_kernel = staticmethod(quantize_mxfp4)
    quantize_ref = staticmethod(ref.quantize_mxfp4)
    dequantize_kernel = staticmethod(dequantize_mxfp4)
    dequantize_ref = staticmethod(ref.dequantize_mxfp4)


class NVFP4(BlockFormat, qtype=GGMLQuantizationType.NVFP4):
    dequantize_kernel = staticmethod(dequantize_nvfp4)
    dequantize_ref = staticmethod(ref.dequantize_nvfp4)
