"""Exact kernels for the i-quants and the ternary types: IQ4_NL, MXFP4, IQ4_XS, TQ1_0, TQ2_0 and the grid
types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, each against its vec_dot type as ggml's generic
``ggml_vec_dot_*_generic`` (ggml-cpu/quants.c) computes it. The integers each product uses come from
``ref_iquants.decode``; this module stores them for the Q8_0 kernels or for its own:

- IQ4_NL, MXFP4 (Q8_0 activations): per block ``sumf += (d_x * d_w) * sumi``, Q8_0's float step
  (``sumi * (d_w * d_x)``: the same products), so the rows are widened at load to Q8_0 blocks of their
  int8 values (``iq4_nl_as_q8_0``: IQ4_NL's fp16 scale kept; ``mxfp4_q8_tiles``: MXFP4's e8m0 scale, a
  power of two that fp16 may not hold, kept in f32 for ``blocks32.mv_q8``).
- TQ1_0, TQ2_0 and the grid types (Q8_K activations): one exact integer sum per super-block,
  ``bsum = sum of scale * sumi`` (TQ: scale 1), then ``sumf += (d_w * d_y) * bsum`` and at the end
  ``*s = c * sumf`` (c = 0.125 for IQ2_*, 0.25 for IQ3_XXS, else 1): ``mv_iq`` on int8 tiles, with c, a
  power of two, folded into the stored d (scaling by 2^-k commutes with every f32 rounding here). IQ1_S / IQ1_M add
  ``IQ1_DELTA * sumi1`` (0.125 times the scaled sums of the activations under each delta sign): stored as
  the values ``8 * grid + delta`` with 0.125 folded into d, ``sumi + 0.125 * sumi1 = (8 sumi + sumi1) / 8``
  is exact in f32 (|8 sumi + sumi1| < 2^24), so the product is unchanged.
- IQ4_XS (Q8_K): per 32 values ``sumf += (d4d8 * (ls - 32)) * sumi`` with ``d4d8 = d_w * d_y``: ``mv_iq``
  on the same int8 tiles.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T
from numba import float32, int16, int32, prange, uint64

from ..formats.iq4 import KVALUES_IQ4NL
from ..formats.mxfp4 import KVALUES_MXFP4
from . import ref_iquants
from ._tiles import N_CHUNKS, TILE_ROWS, row_minor, tile_rows
from .blocks32 import _store

__all__ = ["GRID_KINDS", "iq4_nl_as_q8_0", "mv_iq", "mxfp4_q8_tiles", "pack_iq"]

# the types ``mv_iq`` runs with ``grid``, with the factor folded into their stored d
GRID_KINDS = {**ref_iquants.GRID_TYPES, T.TQ1_0: 1.0, T.TQ2_0: 1.0, T.IQ1_S: 0.125, T.IQ1_M: 0.125}
_PACK_ROWS = 16 * TILE_ROWS  # rows decoded at once while packing (bounds the int64 scratch)


def _nibble_values(qs: np.ndarray, table: np.ndarray) -> np.ndarray:
    """[..., 16] bytes of 4-bit indices -> [..., 32] int8 table values (low nibbles, then high), one byte
    each (an embedding matrix is large: no wider temporaries)."""
    t = table.view(np.uint8)
    return np.concatenate([t[qs & 15], t[qs >> 4]], axis=-1).view(np.int8)


def iq4_nl_as_q8_0(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """IQ4_NL rows -> Q8_0 rows of the same values (kvalues_iq4nl) and fp16 scales."""
    blocks = raw.reshape(rows * (cols // 32), 18)
    out = np.empty((len(blocks), 34), np.uint8)
    out[:, :2] = blocks[:, :2]
    out[:, 2:] = _nibble_values(blocks[:, 2:], KVALUES_IQ4NL).view(np.uint8)
    return out.reshape(rows, -1)


def mxfp4_q8_tiles(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 rows -> ``blocks32``'s portable Q8_0 tiles (qs int8, d f32 = the exact e8m0 scale)."""
    blocks = raw.reshape(rows, cols // 32, 17)
    qs = tile_rows(_nibble_values(blocks[..., 1:], KVALUES_MXFP4), rows)  # [G, 64, nb, 32]
    return row_minor(qs), row_minor(tile_rows(ref_iquants.e8m0_half(blocks[..., 0]), rows))


def _decoded_tiles(qtype: T, raw: np.ndarray, rows: int, cols: int) -> dict[str, list[np.ndarray]]:
    parts: dict[str, list[np.ndarray]] = {"q": [], "sc": [], "d": []}
    for r0 in range(0, rows, _PACK_ROWS):
        m = min(_PACK_ROWS, rows - r0)
        dec = ref_iquants.decode(raw[r0 : r0 + m], qtype, m, cols)
        q = dec["q"]
        if "delta" in dec:  # IQ1: 8 * grid + delta (see module doc)
            q = 8 * q + np.repeat(dec["delta"], 8, axis=-1)
        sc = dec.get("sc", np.ones((m, cols // 256, 16), np.int64))
        with np.errstate(invalid="ignore"):  # a nan scale stays nan
            d = dec["d"] * np.float32(GRID_KINDS.get(qtype, 1.0))
        parts["q"].append(row_minor(tile_rows(q.reshape(m, cols).astype(np.int8), m)))
        parts["sc"].append(row_minor(tile_rows(sc.reshape(m, -1).astype(np.int8), m)))
        parts["d"].append(row_minor(tile_rows(d.astype(np.float32), m)))
    return parts


def pack_iq(qtype: T, raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, ...]:
    """IQ4_XS, TQ or grid rows -> ``mv_iq``'s tiles: q int8 [G, cols * 64], sc int8 [G, cols / 16 * 64] (the
    integer scale of each 16 values; IQ4_XS: ``ls - 32`` of each 32, [G, cols / 32 * 64]), d f32
    [G, nsb * 64] with the type's factor folded in."""
    parts = _decoded_tiles(qtype, raw, rows, cols)
    return tuple(np.concatenate(parts[k]) for k in ("q", "sc", "d"))


@numba.njit(cache=True, nogil=True, inline="always")
def _dot(acc, q, xq, xo, m, R):  # pragma: no cover - numba
    """acc[k] = the exact integer sum of q * x over the m values from xo of the tile's rows k (int8 values
    |q| <= 127 against Q8_K quants: two products still fit int16, widened once per pair)."""
    for k in range(R):
        acc[k] = 0
    for j in range(uint64(0), uint64(m), uint64(2)):
        x0 = int16(xq[xo + j])
        x1 = int16(xq[xo + j + uint64(1)])
        o = (xo + j) * R
        for k in range(R):
            acc[k] += int32(int16(q[o + k]) * x0 + int16(q[o + R + k]) * x1)


@numba.njit(cache=True, nogil=True)
def _tile_iq4xs(y, q, sc, d, xq, xd, nsb, acc, dd, R):  # pragma: no cover - numba
    """IQ4_XS: per 32 values ``sumf += (d4d8 * (ls - 32)) * sumi``, d4d8 = d_w * d_y per super-block."""
    for k in range(R):
        y[k] = float32(0.0)
    for s in range(uint64(nsb)):
        dy = xd[s]
        for k in range(R):
            dd[k] = d[s * R + k] * dy
        for b in range(uint64(8)):
            _dot(acc, q, xq, s * uint64(256) + b * uint64(32), 32, R)
            so = (s * uint64(8) + b) * R
            for k in range(R):
                y[k] = y[k] + (dd[k] * float32(sc[so + k])) * float32(acc[k])


@numba.njit(cache=True, nogil=True)
def _tile_grid(y, q, sc, d, xq, xd, nsb, acc, isum, R):  # pragma: no cover - numba
    """TQ and grid types: ``bsum = sum of scale * sumi`` per super-block (exact int32), then
    ``sumf += (d_w * d_y) * bsum`` (the factor already in d)."""
    for k in range(R):
        y[k] = float32(0.0)
    for s in range(uint64(nsb)):
        for k in range(R):
            isum[k] = 0
        for j in range(uint64(16)):
            _dot(acc, q, xq, s * uint64(256) + j * uint64(16), 16, R)
            so = (s * uint64(16) + j) * R
            for k in range(R):
                isum[k] += int32(sc[so + k]) * acc[k]
        dy = xd[s]
        for k in range(R):
            y[k] = y[k] + (d[s * R + k] * dy) * float32(isum[k])


@numba.njit(cache=True, nogil=True, parallel=True)
def mv_iq(out, q, sc, d, xq, xd, xsum, n, rows, nsb, grid):  # pragma: no cover - numba
    """IQ4_XS (grid False) or a TQ / grid type: out[n, rows] = X @ W.T with X as Q8_K (xq [n, cols],
    xd [n, nsb]; xsum unused), the tiles of ``pack_iq4xs`` / ``pack_grid``."""
    G = q.shape[0]
    R = uint64(d.shape[1] // nsb)
    for c in prange(N_CHUNKS):
        acc = np.empty(R, np.int32)
        scratch = np.empty(R, np.int32)
        dd = np.empty(R, np.float32)
        y = np.empty(R, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            for t in range(n):
                if grid:
                    _tile_grid(y, q[g], sc[g], d[g], xq[t], xd[t], nsb, acc, scratch, R)
                else:
                    _tile_iq4xs(y, q[g], sc[g], d[g], xq[t], xd[t], nsb, acc, dd, R)
                _store(out, y, t, g, rows, R)
