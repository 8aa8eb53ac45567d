"""Per-sequence recurrent state: the memory of short-convolution and Mamba-2 layers.

llama.cpp's ``llama_memory_recurrent`` with one cell per sequence: a recurrent layer keeps, for each
sequence, a state of fixed size that summarises every token the sequence has absorbed (the last
``d_conv`` inputs of a convolution; Mamba-2's SSM state besides). There is no per-position cell, so the
state can be copied to another sequence whole, moved in position, saved and restored, but never cut back
to a prefix: removing any position the state absorbed forgets the state, and a shorter prefix is served
from a checkpoint (``checkpoints.Checkpoints``) or recomputed. Speculative decoding saves a sequence's
state before a pass that absorbs drafts (``snapshot``) and brings it back when drafts are rejected
(``restore``), then runs the accepted tokens again.

``RecurrentPool`` speaks the per-sequence vocabulary of ``kv_cache.CellPool`` (a pool of the model's
``KVCache``), so the scheduler, the checkpoints, the prompt cache and slot files handle both alike: its
"cell" of a sequence is its state row, at the position of the last token absorbed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["RecurrentPool"]

_NO_POS = -1
_MANY = 1 << 62  # a recurrent pool never runs out of cells: a sequence's state does not grow

_EMPTY_I32 = np.zeros(0, np.int32)


class RecurrentPool:
    """The states of ``layers`` for ``n_seq`` sequences: ``r[il]`` [n_seq, r_dim] (the convolution's last
    inputs) and ``s[il]`` [n_seq, s_dim] (an SSM state; width 0 for a layer without one), float32 as
    llama.cpp's default ``type_r`` / ``type_s``."""

    recurrent = True  # a pool whose state cannot be truncated (checkpoints snapshot it)
    window = None
    typed_attention = False

    def __init__(self, n_seq: int, layers: list[int], r_dim: int, s_dim: int = 0) -> None:
        self.n_cells = n_seq
        self.layers = layers
        self.r_dim, self.s_dim = r_dim, s_dim
        self.k = {il: np.zeros((n_seq, r_dim), np.float32) for il in layers}  # conv states
        self.v = {il: np.zeros((n_seq, s_dim), np.float32) for il in layers}  # SSM states
        self.pos = np.full(n_seq, _NO_POS, np.int32)  # the last position each sequence's state absorbed
        # one saved state per sequence (speculative decoding's rollback), allocated on the first `snapshot`
        self._saved: tuple[dict[int, np.ndarray], dict[int, np.ndarray], np.ndarray] | None = None

    # -- queries -----------------------------------------------------------------------------------------

    @property
    def n_free(self) -> int:
        return _MANY

    def n_available(self, seq: int) -> int:
        return _MANY

    def seq_cells(self, seq: int) -> np.ndarray:
        return np.array([seq], np.int32) if self._has(seq) else _EMPTY_I32

    def seq_pos_max(self, seq: int) -> int:
        return int(self.pos[seq]) if 0 <= seq < self.n_cells else _NO_POS

    def seq_pos_min(self, seq: int) -> int:
        return self.seq_pos_max(seq)

    def covers(self, seq: int, p: int) -> bool:
        """Whether the state of ``seq`` is the state before position ``p``: exactly ``p`` tokens absorbed
        (p = 0: any state, the next token at position 0 starts a fresh one)."""
        return p <= 0 or self.seq_pos_max(seq) == p - 1

    def _has(self, seq: int) -> bool:
        return 0 <= seq < self.n_cells and self.pos[seq] >= 0

    # -- a batch -----------------------------------------------------------------------------------------

    def check(self, seq: np.ndarray, pos: np.ndarray) -> None:
        """Raise ValueError unless every run of one sequence's tokens in a batch starts at position 0 (a
        fresh state) or right after the position its state absorbed (or the run before it)."""
        at: dict[int, int] = {}
        for i, end in _runs(seq):
            s, p = int(seq[i]), int(pos[i])
            if not 0 <= s < self.n_cells:
                raise ValueError(f"sequence {s} has no recurrent state (the memory holds {self.n_cells})")
            top = at.get(s, int(self.pos[s]))
            if p != 0 and top != p - 1:
                raise ValueError(f"sequence {s} continues at position {p}, its recurrent state is at {top}")
            at[s] = int(pos[end - 1])

    def place(self, seq: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The state rows of a batch's tokens (each token's sequence), after ``check``: a run starting at
        position 0 starts from a zero state; each sequence's state is then at its last token's position
        (the forward pass absorbs the tokens into it)."""
        for i, end in _runs(seq):
            s = int(seq[i])
            if pos[i] == 0:
                self._zero(s)
            self.pos[s] = pos[end - 1]
        return seq.astype(np.int32, copy=False)

    def _zero(self, seq: int) -> None:
        for il in self.layers:
            self.k[il][seq] = 0
            self.v[il][seq] = 0
        self.pos[seq] = _NO_POS

    # -- sequence operations (llama_memory_recurrent's seq_* counterparts) -------------------------------

    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        """Forget positions [p0, p1) of ``seq``: a range past the state's position leaves it, any range
        that holds an absorbed position forgets the whole state (it cannot be cut back)."""
        if not self._has(seq):
            return
        top = int(self.pos[seq])
        if p0 > top or (p1 >= 0 and p1 <= p0):
            return
        self._zero(seq)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Give ``dst`` the state of ``src`` when [p0, p1) holds every position it absorbed; a part of a
        state is no state, so a shorter range copies nothing."""
        if src == dst or not self._has(src):
            return
        if p0 > 0 or (0 <= p1 <= self.pos[src]):
            return
        for il in self.layers:
            self.k[il][dst] = self.k[il][src]
            self.v[il][dst] = self.v[il][src]
        self.pos[dst] = self.pos[src]

    def seq_add(self, seq: int, p0: int, p1: int, delta: int, shift_k: Callable[..., None]) -> None:
        """Move the state's position by ``delta`` when it lies in [p0, p1) (the state holds no position)."""
        if self._has(seq) and self.pos[seq] >= p0 and (p1 < 0 or self.pos[seq] < p1):
            self.pos[seq] = max(int(self.pos[seq]) + delta, _NO_POS)

    def seq_unshare(self, seq: int) -> None:
        """States are never shared: nothing to do."""

    def seq_export(self, seq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of ``seq``'s state as one "cell": its position [n], the conv states [n_layers, n, r_dim]
        and the SSM states [n_layers, n, s_dim] (n = 1, or 0 without a state)."""
        rows = self.seq_cells(seq)
        r = np.stack([self.k[il][rows] for il in self.layers])
        s = np.stack([self.v[il][rows] for il in self.layers])
        return self.pos[rows].copy(), r, s

    def seq_import(self, seq: int, pos: np.ndarray, r: np.ndarray, s: np.ndarray) -> None:
        """Give ``seq`` the state ``seq_export`` gave (no state: a cleared one)."""
        self._zero(seq)
        if not len(pos):
            return
        if len(pos) != 1 or r.shape[1:] != (1, self.r_dim) or s.shape[1:] != (1, self.s_dim):
            raise ValueError("a recurrent state is one row per layer of this model's widths")
        for i, il in enumerate(self.layers):
            self.k[il][seq] = r[i, 0]
            self.v[il][seq] = s[i, 0]
        self.pos[seq] = int(pos[0])

    # -- rollback (speculative decoding: a pass that absorbs drafts the target may reject) ----------------

    def snapshot(self, seq: int) -> None:
        """Save ``seq``'s state into its row of the saved states (buffers of the pool's size, allocated
        once): ``restore`` brings it back after a pass absorbed tokens that must be dropped."""
        if self._saved is None:
            self._saved = (
                {il: np.zeros_like(self.k[il]) for il in self.layers},
                {il: np.zeros_like(self.v[il]) for il in self.layers},
                np.full(self.n_cells, _NO_POS, np.int32),
            )
        r, s, pos = self._saved
        for il in self.layers:
            r[il][seq] = self.k[il][seq]
            s[il][seq] = self.v[il][seq]
        pos[seq] = self.pos[seq]

    def restore(self, seq: int) -> int:
        """Give ``seq`` the state its last ``snapshot`` saved; returns the position that state absorbed."""
        if self._saved is None:
            raise ValueError(f"sequence {seq} has no saved recurrent state")
        r, s, pos = self._saved
        for il in self.layers:
            self.k[il][seq] = r[il][seq]
            self.v[il][seq] = s[il][seq]
        self.pos[seq] = pos[seq]
        return int(pos[seq])

    def clear(self) -> None:
        for seq in range(self.n_cells):
            self._zero(seq)

    def _reclaim_outside_windows(self) -> None:
        """Nothing to reclaim: a state does not grow."""


def _runs(seq: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal sequence ids in a batch, in order."""
    if not len(seq):
        return []
    starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
    ends = np.r_[starts[1:], len(seq)]
    return list(zip(starts.tolist(), ends.tolist(), strict=True))
