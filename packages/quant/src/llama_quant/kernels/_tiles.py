"""The row-tile layout shared by the exact kernels.

Weights are repacked at load into tiles of ``TILE_ROWS`` consecutive rows; inside a tile every per-row array
is stored element-major, row-minor (``[..., element, row]``). The innermost loop of every kernel then runs
over the rows of a tile with one broadcast activation value: contiguous and branch-free, so LLVM vectorizes
it, and each row's float operations still happen one after the other in ggml's order (the vector lanes are
rows, never parts of one row's sum). Rows past ``rows`` in the last tile are zero padding.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

__all__ = [
    "N_CHUNKS",
    "SPREAD_TOKENS",
    "TILE_ROWS",
    "f16_field",
    "n_tiles",
    "row_minor",
    "spread_tokens",
    "tile_rows",
]

TILE_ROWS = 64  # rows per tile: 64 lanes of the innermost loop
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


SPREAD_TOKENS = 16  # from this many tokens on, the activations are rearranged on all threads (in 16 parts)


@numba.njit(nogil=True, inline="always")
def spread_tokens(fill, out, xq, n, nb):  # pragma: no cover - numba
    """``fill(out, xq, t0, t1, nb)`` over the tokens [0, n): a prompt in SPREAD_TOKENS parts on all threads, a
    few tokens in one call (no parallel launch for a decode step). Inlined, so the ``prange`` is the calling
    kernel's parallel loop and ``fill`` a direct call."""
    if n >= SPREAD_TOKENS:
        for c in prange(SPREAD_TOKENS):
            fill(out, xq, c * n // SPREAD_TOKENS, (c + 1) * n // SPREAD_TOKENS, nb)
    else:
        fill(out, xq, 0, n, nb)
