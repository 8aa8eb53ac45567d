"""Kernels for unquantized weights: F16 and BF16 (kept as their raw 16-bit words) and F32 (numpy BLAS).

F16/BF16 rows are widened to f32 into a per-thread scratch row with integer ops (F16: the exponent and
mantissa bits shifted into f32 position, then scaled by 2**112, exact for zero, subnormals and normals; inf
and nan, never produced by ggml converters, are not preserved) and dotted with every activation row, so a
weight row is read from memory once per call whatever the number of tokens. Counterpart of ggml-cpu's
``ggml_vec_dot_f16`` / ``ggml_vec_dot_bf16``, which convert the activations to 16 bits instead; here they stay
f32, so the only rounding is in the f32 accumulation.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import float32, prange, uint32, uint64

from ._common import N_CHUNKS

__all__ = ["deq_f16", "mv_f16"]

_TWO_112 = float32(2.0**112)


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _widen(f, u, row, cols, bf16):  # pragma: no cover - numba
    """row: [cols] uint16 F16/BF16 words -> f: [cols] f32 (u: the same scratch seen as uint32)."""
    if bf16:
        for i in range(uint64(cols)):
            u[i] = uint32(row[i]) << 16
    else:
        for i in range(uint64(cols)):
            h = uint32(row[i])
            u[i] = ((h & 0x7FFF) << 13) | ((h & 0x8000) << 16)
        for i in range(uint64(cols)):
            f[i] = f[i] * _TWO_112


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def mv_f16(out, w, x, n, rows, cols, bf16):  # pragma: no cover - numba
    """out[n, rows] = x[n, cols] @ w.T for w: [rows, cols] uint16 words of F16 (bf16 False) or BF16."""
    for c in prange(N_CHUNKS):
        u = np.empty(cols, np.uint32)
        f = u.view(np.float32)
        for r in range(rows * c // N_CHUNKS, rows * (c + 1) // N_CHUNKS):
            _widen(f, u, w[r], cols, bf16)
            for t in range(n):
                xt = x[t]
                acc = float32(0.0)
                for i in range(uint64(cols)):
                    acc += f[i] * xt[i]
                out[t, r] = acc


@numba.njit(cache=True, nogil=True, fastmath=True)
def deq_f16(dst, w, r0, m, cols, bf16):  # pragma: no cover - numba
    """dst[0:m, cols] f32 = rows r0 .. r0 + m - 1 of w (F16 or BF16 words); on the calling thread, as the
    dequantization kernels of the BLAS path (see ``deq``)."""
    for i in range(m):
        d = dst[i]
        _widen(d, d.view(np.uint32), w[r0 + i], cols, bf16)
