"""Exact kernels for unquantized weights F16, BF16, F32.

Counterparts of ggml-cpu's scalar ``ggml_vec_dot_f16`` / ``ggml_vec_dot_bf16`` / ``ggml_vec_dot_f32`` (vec.cpp,
the builds without GGML_SIMD): ``sumf += (ggml_float)(x[i] * y[i])`` for i in order, the product an f32 of the
two f32 values (the fp16 / bf16 ones widened exactly), the sum in f64 (ggml_float), the result rounded to
f32. The activations were rounded to the weights' type first (``act.quantize_f16`` / ``quantize_bf16``).
Weights are widened once to f32 and tiled row-minor ([G, cols * 64]: element i of row r at ``i * 64 + r``),
so the vector lanes are rows and each row's f64 sum runs in index order.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T
from numba import float32, float64, prange, uint64

from ._tiles import N_CHUNKS, row_minor, tile_rows

__all__ = ["mv_float", "pack"]


def pack(qtype: T, raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, ...]:
    """Raw rows [rows, row_bytes] uint8 -> (w [G, cols * 64] f32,)."""
    flat = np.ascontiguousarray(raw).reshape(-1)
    if qtype == T.F32:
        w = flat.view(np.float32).reshape(rows, cols)
    elif qtype == T.F16:
        w = flat.view(np.float16).reshape(rows, cols).astype(np.float32)
    else:
        w = (flat.view(np.uint16).reshape(rows, cols).astype(np.uint32) << 16).view(np.float32)
    return (row_minor(tile_rows(w, rows)),)


@numba.njit(cache=True, nogil=True, parallel=True)
def mv_float(out, w, x, n, rows, cols):  # pragma: no cover - numba
    """out[n, rows] = x[n, cols] @ W.T, W tiled f32 (module doc), x already rounded to the weights' type."""
    G = w.shape[0]
    R = uint64(w.shape[1] // cols)
    for c in prange(N_CHUNKS):
        acc = np.empty(R, np.float64)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            wg = w[g]
            for t in range(n):
                xt = x[t]
                for k in range(R):
                    acc[k] = 0.0
                for i in range(uint64(cols)):
                    xi = xt[i]
                    o = i * R
                    for k in range(R):
                        acc[k] += float64(wg[o + k] * xi)
                r0 = g * R
                for k in range(min(R, rows - r0)):
                    out[t, r0 + k] = float32(acc[k])
