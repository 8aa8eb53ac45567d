"""Shared pieces of the matrix kernels: the row-tile layout, activation quantization.

Layout: weights are repacked at load into tiles of ``TILE_ROWS`` consecutive rows. Inside a tile every
per-element array is stored element-major, row-minor (``[..., element, row]``), so the innermost loop of
every kernel runs over the 64 rows of the tile with one broadcast activation value: a contiguous,
branch-free loop that LLVM vectorizes (ymm), with no per-block reduction inside it. Rows past ``rows`` in
the last tile are zero padding.

Activations are quantized once per input vector, as llama.cpp's ``quantize_row_q8_0`` / ``q8_K`` do, to
symmetric int8 with one f32 scale per block (values in [-127, 127]), plus sums of the quants per 16 values.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import float32, int32, uint64

__all__ = ["N_CHUNKS", "TILE_ROWS", "quantize_q8"]

TILE_ROWS = 64  # rows per tile; 64 int16 lanes = 4 ymm registers per element step
N_CHUNKS = 2  # prange chunks: one per core of the 2-core target


def n_tiles(rows: int) -> int:
    return (rows + TILE_ROWS - 1) // TILE_ROWS


def tile_rows(a: np.ndarray, rows: int) -> np.ndarray:
    """[rows, ...] -> [n_tiles, TILE_ROWS, ...], zero-padding the last tile."""
    g = n_tiles(rows)
    if g * TILE_ROWS == rows:
        return a.reshape((g, TILE_ROWS, *a.shape[1:]))
    out = np.zeros((g * TILE_ROWS, *a.shape[1:]), a.dtype)
    out[:rows] = a
    return out.reshape((g, TILE_ROWS, *a.shape[1:]))


def row_minor(a: np.ndarray) -> np.ndarray:
    """[G, TILE_ROWS, e1, e2, ...] -> contiguous [G, e1*e2*...*TILE_ROWS] with the row index innermost."""
    g = a.shape[0]
    perm = (0, *range(2, a.ndim), 1)
    return np.ascontiguousarray(a.transpose(perm)).reshape(g, -1)


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian f16 at byte ``offset`` of every block, as f32."""
    return blocks[..., offset : offset + 2].copy().view(np.float16)[..., 0].astype(np.float32)


@numba.njit(cache=True, nogil=True, fastmath=True)
def quantize_q8(xq, xd, xs, x, n, cols, block, sum_block):  # pragma: no cover - numba
    """Quantize ``x[n, cols]`` to int8 blocks of ``block`` values (32: Q8_0, 256: Q8_K).

    xq[n, cols] int8: round(x / d) in [-127, 127]; xd[n, cols // block] f32: d = amax / 127;
    xs[n, cols // sum_block] int32: sums of quants over groups of ``sum_block`` (as Q8_K's bsums).
    """
    nb = uint64(cols // block)
    ns = uint64(block // sum_block)
    for t in range(uint64(n)):
        xr = x[t]
        qr = xq[t]
        for b in range(nb):
            o = b * uint64(block)
            amax = float32(0.0)
            for i in range(uint64(block)):
                amax = max(amax, abs(xr[o + i]))
            d = amax / float32(127.0)
            inv = float32(1.0) / d if amax > 0 else float32(0.0)
            xd[t, b] = d
            for i in range(uint64(block)):
                qr[o + i] = np.int8(np.rint(xr[o + i] * inv))
            for s in range(ns):
                acc = int32(0)
                so = o + s * uint64(sum_block)
                for i in range(uint64(sum_block)):
                    acc += int32(qr[so + i])
                xs[t, b * ns + s] = acc
