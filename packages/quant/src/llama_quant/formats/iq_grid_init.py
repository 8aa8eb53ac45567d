# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""The search tables of the grid i-quant quantizers, computed from the grids (ggml's iq2xs_init_impl and
iq3xs_init_impl).

A grid point is a group of ``dim`` levels l (0..3 for the 2-bit grids, 0..7 for the 3-bit ones), stored
as the odd values ``2*l + 1`` the quantizers compare against. For every packed level index
``u = sum(l_k << bits*k)`` the tables give either the grid entry at u, or the grid entries nearest to u
(squared distance, the ``nwant`` smallest distances, ties in entry order) that the quantizers search::

    kmap[u] >= 0              the grid entry whose levels are u
    kmap[u] = -(offset + 1)   neighbours[offset] = n, then the n nearest entries

The tables are computed once per process by a numba kernel and cached (a few tenths of a second for
the largest, IQ1_S's 2048 entries).
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit

from llama_quant.formats import grids

__all__ = ["GridTables", "grid_tables"]

T = GGMLQuantizationType


class GridTables(NamedTuple):
    """grid: int8 [entries, dim] of 2*l+1; kmap: int32 [4**8 or 8**4 range]; neighbours: uint16 (flat)."""

    grid: np.ndarray
    kmap: np.ndarray
    neighbours: np.ndarray


# type -> (decoded grid, number of levels per weight in the C index, kmap size, nwant)
_SPECS: dict[GGMLQuantizationType, tuple[np.ndarray, int, int, int]] = {
    T.IQ2_XXS: (grids.IQ2XXS_GRID, 2, 43692, 2),
    T.IQ2_XS: (grids.IQ2XS_GRID, 2, 43692, 2),
    T.IQ2_S: (grids.IQ2S_GRID, 2, 43692, 1),
    T.IQ1_S: (grids.IQ1S_GRID, 2, 43692, 3),
    T.IQ1_M: (grids.IQ1S_GRID, 2, 43692, 3),
    T.IQ3_XXS: (grids.IQ3XXS_GRID, 3, 4096, 2),
    T.IQ3_S: (grids.IQ3S_GRID, 3, 4096, 3),
}


def _levels(grid: np.ndarray) -> np.ndarray:
    # the grids store each level's value; the levels are the ranks of the distinct values (every grid
    # uses all of its values, so the rank is the index into its value map)
    values = np.unique(grid)
    return np.searchsorted(values, grid).astype(np.int64)


@njit(cache=True, error_model="numpy")
def _pos_of(i, bits, dim, pos):
    mask = (1 << bits) - 1
    for k in range(dim):
        pos[k] = 2 * ((i >> (bits * k)) & mask) + 1


@njit(cache=True, error_model="numpy")
def _nearest(pos, grid, nwant, d2, order):
    """The entries of the nwant smallest distances to pos, by (distance, entry); returns their count."""
    ng, dim = grid.shape
    for j in range(ng):
        s = 0
        for k in range(dim):
            t = np.int64(grid[j, k]) - pos[k]
            s += t * t
        d2[j] = s
    n = 0
    last = -1
    for _ in range(nwant):
        cur = -1  # the next distance above last
        for j in range(ng):
            if d2[j] > last and (cur < 0 or d2[j] < cur):
                cur = d2[j]
        if cur < 0:
            break
        for j in range(ng):
            if d2[j] == cur:
                order[n] = j
                n += 1
        last = cur
    return n


@njit(cache=True, error_model="numpy")
def _build(grid, levels, bits, kmap_size, nwant):
    ng, dim = grid.shape
    kmap = np.full(kmap_size, -1, np.int32)
    for j in range(ng):
        u = 0
        for k in range(dim):
            u |= levels[j, k] << (bits * k)
        kmap[u] = j
    pos = np.empty(dim, np.int64)
    d2 = np.empty(ng, np.int64)
    order = np.empty(ng, np.int64)
    total = 0
    for i in range(kmap_size):
        if kmap[i] < 0:
            _pos_of(i, bits, dim, pos)
            total += 1 + _nearest(pos, grid, nwant, d2, order)
    neighbours = np.empty(total, np.uint16)
    off = 0
    for i in range(kmap_size):
        if kmap[i] >= 0:
            continue
        _pos_of(i, bits, dim, pos)
        n = _nearest(pos, grid, nwant, d2, order)
        kmap[i] = -(off + 1)
        neighbours[off] = n
        for m in range(n):
            neighbours[off + 1 + m] = order[m]
        off += 1 + n
    return kmap, neighbours


@cache
def grid_tables(qtype: GGMLQuantizationType) -> GridTables:
    """The grid (2*l+1 values), kmap and neighbour lists the quantizer of ``qtype`` searches (cached)."""
    values, bits, kmap_size, nwant = _SPECS[T(qtype)]
    levels = _levels(values)
    grid = (2 * levels + 1).astype(np.int8)
    kmap, neighbours = _build(grid, levels, bits, kmap_size, nwant)
    for a in (grid, kmap, neighbours):
        a.setflags(write=False)
    return GridTables(grid, kmap, neighbours)
