"""Fast kernels for unquantized weights F16, BF16, F32: f32 sums in vector lanes, as llama.cpp's native build.

The exact kernels (``floats``, ``halves``) give the bits of ggml's portable build: every product added to an
f64 sum in index order. llama.cpp's native build sums in f32 SIMD lanes instead, and so do these: each
output's products (weight widened to f32 times the activation, already rounded to the weights' type as
ggml's vec_dot type asks) are added in index order to an f32 sum with a multiply-add, 16 outputs to a vector.
The results differ from the exact ones by f32 rounding of the running sums (about 1e-7 relative to the sum
of the products' magnitudes); they do not depend on how tokens are batched.

Half the arithmetic width of f64 lanes doubles what a vector instruction does and the fp16 weights widen in
one instruction instead of two, so a pass over a tile for several tokens costs little more than one: a
verified draft or a prompt chunk is bounded by reading the weights, not by the sums. The tiles are the exact
kernels' (``_tiles``: element i of row r at ``i * 64 + r``): fp16 for F16 (``halves.pack_f16``), f32 for F32
and BF16 (``floats.pack``).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange

from ._tiles import N_CHUNKS, TILE_ROWS
from .halves import _put, lane_pass

__all__ = ["mm_fast"]

_LANES = 16
_BLOCK = 4  # tokens of a pass against a whole tile, 16 sums in registers (what is left: two, then one)


def _pass(lanes: int, tokens: int, half: bool):  # type: ignore[no-untyped-def]
    """f32 sums, 16 rows to a vector, of fp16 (``half``) or f32 weights (``halves.lane_pass``)."""
    return lane_pass(
        lanes, tokens, _LANES, ir.FloatType(), ir.HalfType() if half else ir.FloatType(), "llvm.fmuladd"
    )


_h1, _h2, _h4 = _pass(TILE_ROWS, 1, True), _pass(TILE_ROWS, 2, True), _pass(TILE_ROWS, _BLOCK, True)
_f1, _f2, _f4 = _pass(TILE_ROWS, 1, False), _pass(TILE_ROWS, 2, False), _pass(TILE_ROWS, _BLOCK, False)


@numba.njit(cache=True, nogil=True, inline="always")
def _run(res, half, b, wg, roff, xf, xoff, cols):  # pragma: no cover - numba
    """One pass of b tokens (4, 2 or 1) against a whole tile of fp16 or f32 weights."""
    if half:
        if b == _BLOCK:
            _h4(res, wg, roff, xf, xoff, cols)
        elif b == 2:
            _h2(res, wg, roff, xf, xoff, cols)
        else:
            _h1(res, wg, roff, xf, xoff, cols)
    elif b == _BLOCK:
        _f4(res, wg, roff, xf, xoff, cols)
    elif b == 2:
        _f2(res, wg, roff, xf, xoff, cols)
    else:
        _f1(res, wg, roff, xf, xoff, cols)


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_fast(out, w, x, n, rows, cols, half):  # pragma: no cover - numba
    """out[n, rows] = x[n, cols] @ W.T for W in tiles of fp16 bits (``half``: ``halves.pack_f16``) or f32
    (``floats.pack``: F32, BF16 widened), x already rounded to the weights' type; f32 sums."""
    G = w.shape[0]
    xf = np.empty(n * cols, np.float32)
    for t in range(n):
        for i in range(cols):
            xf[t * cols + i] = x[t, i]
    for c in prange(N_CHUNKS):
        res = np.empty(_BLOCK * TILE_ROWS, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            wg = w[g]
            r0 = g * TILE_ROWS
            m = min(TILE_ROWS, rows - r0)
            t = 0
            while t + _BLOCK <= n:  # whole tiles: each pass reads the tile's contiguous bytes once
                _run(res, half, _BLOCK, wg, 0, xf, t * cols, cols)
                _put(out, res, t, _BLOCK, TILE_ROWS, r0, m)
                t += _BLOCK
            while t + 2 <= n:
                _run(res, half, 2, wg, 0, xf, t * cols, cols)
                _put(out, res, t, 2, TILE_ROWS, r0, m)
                t += 2
            while t < n:
                _run(res, half, 1, wg, 0, xf, t * cols, cols)
                _put(out, res, t, 1, TILE_ROWS, r0, m)
                t += 1
