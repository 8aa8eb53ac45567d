"""The trie walk's inner loop, compiled: grammar steps read from a dense table (state row x code point
column), filled from ``CompiledGrammar.step`` the first time a cell is needed.

The kernel walks the depth-first trie until it meets a cell not yet known; the caller computes that step
in Python, stores it and resumes the kernel where it stopped. A walk over a state seen before runs
entirely in compiled code.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .compiled import CompiledGrammar

__all__ = ["StepTable", "compile_walk", "walk_trie"]

_UNKNOWN = -1
_TABLE_BYTES = 64 << 20  # rows are reused (the table emptied) past this


class StepTable:
    """Dense steps of one compiled grammar over one vocabulary's code points."""

    def __init__(self, n_cols: int) -> None:
        self.n_cols = max(n_cols, 1)
        self.max_rows = max(16, _TABLE_BYTES // (4 * self.n_cols))
        self.cells = np.full((16, self.n_cols), _UNKNOWN, dtype=np.int32)
        self.row_of = np.full(64, -1, dtype=np.int32)  # state id -> row, -1: none yet
        self.n_rows = 0

    def cover(self, n_states: int) -> None:
        """Make row_of reach every state id below n_states."""
        if n_states > self.row_of.shape[0]:
            grown = np.full(max(n_states, 2 * self.row_of.shape[0]), -1, dtype=np.int32)
            grown[: self.row_of.shape[0]] = self.row_of
            self.row_of = grown

    def row(self, state: int) -> int:
        """The row of a state (a new one if it has none; the table is emptied when full)."""
        r = int(self.row_of[state])
        if r >= 0:
            return r
        if self.n_rows == self.max_rows:
            self.row_of[:] = -1
            self.n_rows = 0
        if self.n_rows == self.cells.shape[0]:
            grown = np.full((min(2 * self.n_rows, self.max_rows), self.n_cols), _UNKNOWN, dtype=np.int32)
            grown[: self.n_rows] = self.cells[: self.n_rows]
            self.cells = grown
        r = self.n_rows
        self.cells[r] = _UNKNOWN
        self.row_of[state] = r
        self.n_rows += 1
        return r


@njit(cache=True, nogil=True)
def _walk(i, depth, end, col, states, cells, row_of, node_state):  # pragma: no cover - compiled
    n = depth.shape[0]
    while i < n:
        prev = states[depth[i] - 1]
        if prev >= row_of.shape[0]:
            return i
        r = row_of[prev]
        if r < 0:
            return i
        s = cells[r, col[i]]
        if s == -1:
            return i
        if s == 0:  # no stack accepts this prefix: skip its subtree
            i = end[i]
            continue
        states[depth[i]] = s
        node_state[i] = s
        i += 1
    return n


def walk_trie(
    g: CompiledGrammar,
    table: StepTable,
    sid: int,
    depth: np.ndarray,
    end: np.ndarray,
    col: np.ndarray,
    cp_of: list[int],
    max_depth: int,
) -> np.ndarray:
    """The state reached at every trie node from ``sid`` (0 where the walk did not reach)."""
    n = depth.shape[0]
    node_state = np.zeros(n, dtype=np.int32)
    states = np.zeros(max_depth + 1, dtype=np.int32)
    states[0] = sid
    i = 1
    while True:
        table.cover(len(g.states))
        i = _walk(i, depth, end, col, states, table.cells, table.row_of, node_state)
        if i >= n:
            return node_state
        prev = int(states[depth[i] - 1])
        nxt = g.step(prev, cp_of[i])
        table.cover(len(g.states))
        r = table.row(prev)
        table.cells[r, col[i]] = nxt


def compile_walk() -> None:
    """Compile the kernel (or load it from numba's cache) now, e.g. while a vocabulary is being built off
    the engine thread, rather than on the first grammar request."""
    one = np.zeros(1, dtype=np.int32)
    _walk(1, one, one, one, one, np.zeros((1, 1), dtype=np.int32), one, one)
