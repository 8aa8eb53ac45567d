# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""Dequantize kernels of the k-quants Q2_K .. Q6_K (block layouts in ``llama_quant.formats.kquants``).

Each evaluates the float32 expressions of gguf-py's ``dequantize_blocks`` (``d * sc * q - dmin * m`` and
friends), so results are bit-identical to ``gguf.quants.dequantize``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llama_quant.formats.common import get_f16
from llama_quant.formats.drivers import dequantize_blocks

__all__ = [
    "dequantize_q2_k",
    "dequantize_q3_k",
    "dequantize_q4_k",
    "dequantize_q5_k",
    "dequantize_q6_k",
    "scale_min_k4",
]

_f = np.float32


@njit(cache=True, inline="always", error_model="numpy")
def scale_min_k4(j, q):
    """get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 packed bytes q."""
    if j < 4:
        return np.int64(q[j]) & 63, np.int64(q[j + 4]) & 63
    return (np.int64(q[j + 4]) & 0xF) | ((np.int64(q[j - 4]) >> 6) << 4), (np.int64(q[j + 4]) >> 4) | (
        (np.int64(q[j]) >> 6) << 4
    )


@njit(cache=True, error_model="numpy")
def _dq_q2_k(b, y):
    d = get_f16(b, 80)
    dmin = get_f16(b, 82)
    for p in range(256):
        s = np.int64(b[p // 16])
        h, r = divmod(p, 128)
        q = (np.int64(b[16 + 32 * h + r % 32]) >> (2 * (r // 32))) & 3
        y[p] = (d * _f(s & 0xF)) * _f(q) - dmin * _f(s >> 4)


@njit(cache=True, error_model="numpy")
def _dq_q3_k(b, y):
    d = get_f16(b, 108)
    for p in range(256):
        k = p // 16
        lo = (np.int64(b[96 + k]) & 0xF) if k < 8 else (np.int64(b[96 + k - 8]) >> 4)
        hi = (np.int64(b[104 + k % 4]) >> (2 * (k // 4))) & 3
        dl = d * _f((lo | (hi << 4)) - 32)
        h, r = divmod(p, 128)
        ql = (np.int64(b[32 + 32 * h + r % 32]) >> (2 * (r // 32))) & 3
        hbit = (np.int64(b[p % 32]) >> (p // 32)) & 1
        y[p] = dl * _f(ql - ((hbit ^ 1) << 2))


@njit(cache=True, error_model="numpy")
def _dq_q45_k(b, y, five):  # Q4_K, or Q5_K when five
    d = get_f16(b, 0)
    dmin = get_f16(b, 2)
    qs0 = 48 if five else 16
    for k in range(8):
        s6, m6 = scale_min_k4(k, b[4:16])
        dl = d * _f(s6)
        ml = dmin * _f(m6)
        c, nib = divmod(k, 2)
        for m in range(32):
            q = (np.int64(b[qs0 + 32 * c + m]) >> (4 * nib)) & 0xF
            if five:
                q |= ((np.int64(b[16 + m]) >> k) & 1) << 4
            y[32 * k + m] = dl * _f(q) - ml


@njit(cache=True, error_model="numpy")
def _dq_q6_k(b, y):
    d = get_f16(b, 208)
    for p in range(256):
        sv = np.int64(b[192 + p // 16])
        dl = d * _f(sv - 256 if sv > 127 else sv)
        h, r = divmod(p, 128)
        nib, idx = divmod(r, 64)
        ql = (np.int64(b[64 * h + idx]) >> (4 * nib)) & 0xF
        qh = (np.int64(b[128 + 32 * h + r % 32]) >> (2 * (r // 32))) & 3
        y[p] = dl * _f((ql | (qh << 4)) - 32)


@njit(cache=True, inline="always", error_model="numpy")
def _dq_q4_k(b, y):
    _dq_q45_k(b, y, False)


@njit(cache=True, inline="always", error_model="numpy")
def _dq_q5_k(b, y):
    _dq_q45_k(b, y, True)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_q2_k(raw, n, out):
    dequantize_blocks(_dq_q2_k, raw, n, out, 256, 84)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_q3_k(raw, n, out):
    dequantize_blocks(_dq_q3_k, raw, n, out, 256, 110)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_q4_k(raw, n, out):
    dequantize_blocks(_dq_q4_k, raw, n, out, 256, 144)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_q5_k(raw, n, out):
    dequantize_blocks(_dq_q5_k, raw, n, out, 256, 176)


@njit(cache=True, parallel=True, error_model="numpy")
def dequantize_q6_k(raw, n, out):
    dequantize_blocks(_dq_q6_k, raw, n, out, 256, 210)
