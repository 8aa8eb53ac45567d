"""The KV cache: one pool of cells shared by every sequence, with per-sequence bookkeeping.

As llama.cpp's unified KV cache: a cell holds one position's keys and values for every layer of its pool,
the position, and the set of sequences that see it. Copying a prefix to another sequence adds that
sequence to the cells (no data moves), so a prompt prefix computed for one slot serves every slot.
Models with sliding-window layers (gemma3) get a second, smaller pool for those layers whose cells
outside every sequence's window are reclaimed when space runs out (`--swa-full` keeps them all).
Models with recurrent layers (lfm2, granitehybrid) get a `memory.RecurrentPool` last: one state per
sequence for those layers (llama.cpp's hybrid memory), handled by the same per-sequence operations.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .kv_types import KV_TYPES, KVType, decode_rows, encode_rows, kv_type, rotation_sizes
from .memory import RecurrentPool
from .ops.flash_attn import fwht_rows

if TYPE_CHECKING:
    from .batch import Batch

__all__ = [
    "KV_TYPES",
    "MAX_SEQUENCES",
    "CellPool",
    "KVCache",
    "KVCacheFullError",
    "KVType",
    "Placement",
    "ShiftK",
]

# Re-rotates the keys of `cells` in one layer's key array by a position delta: (layer, k, cells, delta).
ShiftK = Callable[[int, np.ndarray, np.ndarray, int], None]

MAX_SEQUENCES = 64  # sequence sets are uint64 bitmasks


class KVCacheFullError(RuntimeError):
    """No free cells for a batch: the caller must shrink the batch, free sequences or shift context."""


@dataclass(slots=True)
class _Ranges:
    """Where each token of a batch looks in a pool: token t attends to cells[lo[t]:hi[t]]."""

    cells: np.ndarray  # int32, the concatenated position-sorted cell lists of the batch's sequences
    lo: np.ndarray  # int32 [n]
    hi: np.ndarray  # int32 [n]


@dataclass(slots=True)
class Placement:
    """Where a batch went, per pool (``KVCache.pools`` order): the cells its tokens were stored in and the
    ranges each token attends to; ``n_pos`` is one past the batch's highest position (the RoPE tables'
    length). One per cache, refilled by every ``KVCache.place``."""

    cells: list[np.ndarray]
    ranges: list[_Ranges]
    n_pos: int = 0


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16) if a.dtype == np.float16 else a


class CellPool:
    """Cells for a group of layers: keys/values [n_cells, kv_dim] per layer, positions, sequence sets."""

    def __init__(
        self,
        n_cells: int,
        layers: list[int],
        kv_dim: int,
        window: int | None,
        type_k: str = "f16",
        type_v: str = "f16",
        flash_attn: bool = False,
        head_dim: int = 0,
    ) -> None:
        self.n_cells = n_cells
        self.layers = layers
        self.window = window  # None: full attention; else a token at p sees cells with p - pos < window
        # sequences whose cells stay even outside the window: a suspended pass still attends to them
        self.pinned: Container[int] = frozenset()
        # stores round to the cache type (f32 -> f16 to nearest even, as ggml_cpy; block types quantized)
        self.kv_dim = kv_dim
        self.type_k, self.type_v = kv_type(type_k), kv_type(type_v)
        self.k = {il: self.type_k.zeros(n_cells, kv_dim) for il in layers}
        self.v = {il: self.type_v.zeros(n_cells, kv_dim) for il in layers}
        # the same arrays as the attention kernels take them: an f16 layer as its uint16 bits
        self.kernel_kv = {il: (_bits(self.k[il]), _bits(self.v[il])) for il in layers}
        # flash attention and bf16 / block-type caches run ops.attend_typed, which stores through `store`
        self.typed_attention = flash_attn or not (self.type_k.float_array and self.type_v.float_array)
        # block-type caches hold Walsh-Hadamard-rotated rows (kv_types.rotation_sizes), as llama.cpp's
        self.rot_k, self.rot_v = rotation_sizes(type_k, type_v, head_dim)
        self.attention_kinds = (self.type_k.code, self.type_v.code, flash_attn, self.rot_k, self.rot_v)
        self._stores: dict[int, Callable[[np.ndarray, np.ndarray, np.ndarray], None]] = {}
        self.pos = np.full(n_cells, -1, np.int32)
        self.seqs = np.zeros(n_cells, np.uint64)
        self._free = list(range(n_cells - 1, -1, -1))  # a stack: lowest index allocated first
        self._seq_cells: dict[int, np.ndarray] = {}

    # -- queries -----------------------------------------------------------------------------------------

    @property
    def n_free(self) -> int:
        return len(self._free)

    def store(self, layer: int) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
        """A function storing float32 key and value rows [m, kv_dim] of `layer` into cells [m] (encoded)."""
        if layer in self._stores:
            return self._stores[layer]
        k, v = self.k[layer], self.v[layer]

        def put(cells: np.ndarray, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
            k[cells] = encode_rows(self.type_k, k_rows)
            v[cells] = encode_rows(self.type_v, v_rows)

        self._stores[layer] = put
        return put

    def seq_cells(self, seq: int) -> np.ndarray:
        """The cells of `seq`, sorted by position."""
        return self._seq_cells.get(seq, _EMPTY)

    def seq_pos_max(self, seq: int) -> int:
        cells = self.seq_cells(seq)
        return int(self.pos[cells[-1]]) if len(cells) else -1

    def seq_pos_min(self, seq: int) -> int:
        cells = self.seq_cells(seq)
        return int(self.pos[cells[0]]) if len(cells) else -1

    # -- allocation --------------------------------------------------------------------------------------

    def place(self, seq: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Allocate one cell per token (seq[t], pos[t]); returns the cells (int32 [n])."""
        n = len(seq)
        if n > len(self._free):
            self._reclaim_outside_windows()
        if n > len(self._free):
            raise KVCacheFullError(f"the KV cache has {len(self._free)} free cells, the batch needs {n}")
        cells = np.array([self._free.pop() for _ in range(n)], dtype=np.int32)
        self.pos[cells] = pos
        self.seqs[cells] = np.left_shift(np.uint64(1), seq.astype(np.uint64))
        for s in np.unique(seq):
            new = cells[seq == s]
            old = self._seq_cells.get(int(s), _EMPTY)
            merged = np.concatenate([old, new])
            if len(old) and self.pos[old[-1]] >= self.pos[new[0]]:
                merged = merged[np.argsort(self.pos[merged], kind="stable")]
            self._seq_cells[int(s)] = merged
        return cells

    def ranges(self, seq: np.ndarray, pos: np.ndarray) -> _Ranges:
        """For each token, the range of the concatenated cell lists it attends to (causal, windowed)."""
        lists = []
        offsets: dict[int, int] = {}
        total = 0
        for s in np.unique(seq):
            cells = self._seq_cells.get(int(s), _EMPTY)
            offsets[int(s)] = total
            lists.append(cells)
            total += len(cells)
        cat = np.concatenate(lists).astype(np.int32) if lists else _EMPTY
        cat_pos = self.pos[cat]
        lo = np.empty(len(seq), np.int32)
        hi = np.empty(len(seq), np.int32)
        for s, off in offsets.items():
            mask = seq == s
            seg = cat_pos[off : off + len(self._seq_cells.get(s, _EMPTY))]
            p = pos[mask]
            hi[mask] = off + np.searchsorted(seg, p, side="right")
            if self.window is None:
                lo[mask] = off
            else:
                lo[mask] = off + np.searchsorted(seg, p - self.window, side="right")
        return _Ranges(cat, lo, hi)

    # -- sequence operations (llama_memory_seq_* counterparts) -------------------------------------------

    def _release(self, cells: np.ndarray, seq: int) -> None:
        bit = np.uint64(1) << np.uint64(seq)
        self.seqs[cells] &= ~bit
        emptied = cells[self.seqs[cells] == 0]
        self.pos[emptied] = -1
        self._free.extend(int(c) for c in emptied[::-1])

    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        """Forget positions [p0, p1) of `seq` (p1 < 0: to the end); cells no sequence sees are freed."""
        cells = self._seq_cells.get(seq)
        if cells is None:
            return
        p = self.pos[cells]
        hit = (p >= p0) & ((p < p1) if p1 >= 0 else True)
        self._release(cells[hit], seq)
        keep = cells[~hit]
        if len(keep):
            self._seq_cells[seq] = keep
        else:
            del self._seq_cells[seq]

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Let `dst` see positions [p0, p1) of `src` (shares cells; nothing is copied)."""
        cells = self._seq_cells.get(src, _EMPTY)
        p = self.pos[cells]
        hit = cells[(p >= p0) & ((p < p1) if p1 >= 0 else True)]
        if not len(hit):
            return
        self.seqs[hit] |= np.uint64(1) << np.uint64(dst)
        old = self._seq_cells.get(dst, _EMPTY)
        merged = np.union1d(old, hit).astype(np.int32)
        self._seq_cells[dst] = merged[np.argsort(self.pos[merged], kind="stable")]

    def seq_add(self, seq: int, p0: int, p1: int, delta: int, shift_k: ShiftK) -> None:
        """Move positions [p0, p1) of `seq` by `delta`, re-rotating their keys (context shift).

        Cells shared with other sequences move for all of them, as in llama.cpp: shift a sequence whose
        cells are its own. Positions must stay non-negative (remove the discarded range first).
        """
        cells = self._seq_cells.get(seq, _EMPTY)
        p = self.pos[cells]
        hit = cells[(p >= p0) & ((p < p1) if p1 >= 0 else True)]
        if not len(hit) or delta == 0:
            return
        if int(self.pos[hit].min()) + delta < 0:
            raise ValueError(f"shifting sequence {seq} by {delta} would make positions negative")
        for il in self.layers:
            if self.type_k.float_array:
                shift_k(il, self.k[il], hit, delta)
            else:  # as llama.cpp's K shift of a quantized cache: to f32, rotate, store back
                rows = decode_rows(self.type_k, self.k[il][hit], self.kv_dim)
                if self.rot_k:  # rotate back, shift, rotate forward (the rotation is its own inverse)
                    fwht_rows(rows, len(rows), 0, self.kv_dim, self.rot_k)
                shift_k(il, rows, np.arange(len(hit), dtype=np.int32), delta)
                if self.rot_k:
                    fwht_rows(rows, len(rows), 0, self.kv_dim, self.rot_k)
                self.k[il][hit] = encode_rows(self.type_k, rows)
        self.pos[hit] += delta
        self._seq_cells[seq] = cells[np.argsort(self.pos[cells], kind="stable")]

    def seq_unshare(self, seq: int) -> None:
        """Give `seq` private copies of the cells it shares with other sequences (before shifting it)."""
        cells = self._seq_cells.get(seq, _EMPTY)
        bit = np.uint64(1) << np.uint64(seq)
        shared = cells[(self.seqs[cells] & ~bit) != 0]
        if not len(shared):
            return
        if len(shared) > len(self._free):
            raise KVCacheFullError("no free cells to unshare a sequence before shifting it")
        fresh = np.array([self._free.pop() for _ in range(len(shared))], dtype=np.int32)
        for il in self.layers:
            self.k[il][fresh] = self.k[il][shared]
            self.v[il][fresh] = self.v[il][shared]
        self.pos[fresh] = self.pos[shared]
        self.seqs[fresh] = bit
        self.seqs[shared] &= ~bit
        mine = np.concatenate([np.setdiff1d(cells, shared, assume_unique=True), fresh]).astype(np.int32)
        self._seq_cells[seq] = mine[np.argsort(self.pos[mine], kind="stable")]

    def seq_export(self, seq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of `seq`'s positions [n] and keys and values [n_layers, n, kv_dim] (layers in order)."""
        cells = self.seq_cells(seq)
        k = np.stack([self.k[il][cells] for il in self.layers])
        v = np.stack([self.v[il][cells] for il in self.layers])
        return self.pos[cells].copy(), k, v

    def n_available(self, seq: int) -> int:
        """Cells free once `seq` is removed: the free ones plus those only `seq` sees."""
        cells = self.seq_cells(seq)
        own = int(np.count_nonzero(self.seqs[cells] == (np.uint64(1) << np.uint64(seq))))
        return self.n_free + own

    def seq_import(self, seq: int, pos: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Give the (empty) sequence `seq` new cells at `pos` holding keys/values [n_layers, n, kv_dim]."""
        if not len(pos):
            return
        cells = self.place(np.full(len(pos), seq, np.int32), pos.astype(np.int32))
        for i, il in enumerate(self.layers):
            self.k[il][cells] = k[i]
            self.v[il][cells] = v[i]

    def clear(self) -> None:
        self.pos[:] = -1
        self.seqs[:] = 0
        self._free = list(range(self.n_cells - 1, -1, -1))
        self._seq_cells.clear()

    def _reclaim_outside_windows(self) -> None:
        """Free cells that no sequence can attend to again (only for windowed pools)."""
        if self.window is None:
            return
        for seq in list(self._seq_cells):
            if seq in self.pinned:
                continue
            # later tokens sit at top + 1 or beyond and see positions > top + 1 - window
            top = self.seq_pos_max(seq)
            self.seq_rm(seq, 0, top - self.window + 2)

    def covers(self, seq: int, p: int) -> bool:
        """Whether this pool still holds what a token at position `p` of `seq` would attend to below p."""
        if p <= 0:
            return True
        cells = self.seq_cells(seq)
        if not len(cells):
            return False
        need_from = 0 if self.window is None else max(0, p - self.window + 1)
        present = self.pos[cells]
        present = present[(present >= need_from) & (present < p)]
        return len(present) == p - need_from


_EMPTY = np.zeros(0, np.int32)


class KVCache:
    """The memory of one model: a full-attention pool and, for sliding-window layers, a windowed pool, of
    the attention layers ``layers`` (None: every layer); a ``recurrent`` pool holds the other layers'
    per-sequence state."""

    def __init__(
        self,
        n_ctx: int,
        n_layer: int,
        kv_dim: int,
        swa_layers: frozenset[int] = frozenset(),
        window: int | None = None,
        n_seq_max: int = 1,
        n_ubatch: int = 512,
        swa_full: bool = False,
        type_k: str = "f16",
        type_v: str = "f16",
        flash_attn: bool = False,
        head_dim: int = 0,
        layers: list[int] | None = None,
        recurrent: RecurrentPool | None = None,
    ) -> None:
        if n_seq_max > MAX_SEQUENCES:
            raise ValueError(f"at most {MAX_SEQUENCES} sequences share one KV cache, asked for {n_seq_max}")
        self.n_ctx = n_ctx
        self.type_k, self.type_v = type_k, type_v
        self.flash_attn = flash_attn
        # sequences of a suspended forward pass (`DecoderModel.forward(resume=)`): their placed tokens still
        # attend to cells a windowed pool would otherwise reclaim (`pin`)
        self.pinned: Container[int] = frozenset()
        attn = range(n_layer) if layers is None else layers
        full_layers = [il for il in attn if il not in swa_layers]
        self.pools: list[CellPool | RecurrentPool] = []
        self._pool_of: dict[int, CellPool | RecurrentPool] = {}
        self._pool_index: dict[int, int] = {}
        if full_layers:
            self._add_pool(CellPool(n_ctx, full_layers, kv_dim, None, type_k, type_v, flash_attn, head_dim))
        if swa_layers:
            assert window is not None and window > 0
            size = n_ctx if swa_full else min(n_ctx, n_seq_max * window + n_ubatch)
            self._add_pool(
                CellPool(size, sorted(swa_layers), kv_dim, window, type_k, type_v, flash_attn, head_dim)
            )
        self.recurrent = recurrent
        if recurrent is not None:
            self._add_pool(recurrent)

    @property
    def can_shift(self) -> bool:
        """Whether positions can be removed from the middle of a sequence and the rest moved (context
        shift, cache reuse by shifting): not with recurrent state, which cannot drop what it absorbed."""
        return self.recurrent is None

    def pin(self, seqs: Container[int]) -> None:
        """Keep the cells of `seqs` from a window's reclaiming; a live view (the scheduler's suspended
        sequences) follows its owner."""
        self.pinned = seqs
        for p in self.pools:
            if isinstance(p, CellPool):
                p.pinned = seqs

    def _add_pool(self, pool: CellPool | RecurrentPool) -> None:
        if isinstance(pool, CellPool):
            pool.pinned = self.pinned
        self.pools.append(pool)
        for il in pool.layers:
            self._pool_of[il] = pool
            self._pool_index[il] = len(self.pools) - 1
        self._placement = Placement(
            [_EMPTY] * len(self.pools), [_Ranges(_EMPTY, _EMPTY, _EMPTY)] * len(self.pools)
        )

    def pool(self, layer: int) -> CellPool | RecurrentPool:
        return self._pool_of[layer]

    def cell_pool(self, layer: int) -> CellPool:
        """The pool of cells holding attention layer ``layer``'s keys and values."""
        pool = self._pool_of[layer]
        if not isinstance(pool, CellPool):
            raise ValueError(f"layer {layer} is a recurrent layer: it has no keys and values")
        return pool

    def pool_index(self, layer: int) -> int:
        """The index in ``pools`` (and in a ``Placement``) of the pool holding ``layer``."""
        return self._pool_index[layer]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for p in self.pools for a in (*p.k.values(), *p.v.values()))

    def n_free(self) -> int:
        return min(p.n_free for p in self.pools)

    def seq_pos_max(self, seq: int) -> int:
        return max(p.seq_pos_max(seq) for p in self.pools)

    def place(self, batch: Batch) -> Placement:
        """Allocate cells for every token of the batch in every pool (all or nothing), and compute
        each token's attention range (the cache's one ``Placement``, valid until the next call)."""
        for p in self.pools:
            if p.n_free < batch.n:
                p._reclaim_outside_windows()
            if p.n_free < batch.n:
                raise KVCacheFullError(f"the KV cache has {p.n_free} free cells, the batch needs {batch.n}")
        placed = self._placement
        if self.recurrent is not None:  # first: a batch that does not continue a state changes nothing
            self.recurrent.check(batch.seq, batch.pos)
        for i, p in enumerate(self.pools):
            placed.cells[i] = p.place(batch.seq, batch.pos)
            if isinstance(p, CellPool):
                placed.ranges[i] = p.ranges(batch.seq, batch.pos)
        placed.n_pos = int(batch.pos.max()) + 1 if batch.n else 0
        return placed

    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        for p in self.pools:
            p.seq_rm(seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        for p in self.pools:
            p.seq_cp(src, dst, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int, shift_k: ShiftK) -> None:
        for p in self.pools:
            p.seq_add(seq, p0, p1, delta, shift_k)

    def seq_unshare(self, seq: int) -> None:
        for p in self.pools:
            p.seq_unshare(seq)

    def clear(self) -> None:
        for p in self.pools:
            p.clear()

    def seq_export(self, seq: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per pool, copies of `seq`'s positions, keys and values (see CellPool.seq_export)."""
        return [p.seq_export(seq) for p in self.pools]

    def seq_import(self, seq: int, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """Replace `seq`'s cells by `parts` (positions, keys, values per pool). All or nothing: when a pool
        has too few cells, KVCacheFullError is raised and `seq` is left as it was."""
        if len(parts) != len(self.pools):
            raise ValueError(f"{len(parts)} pools of state for a cache of {len(self.pools)}")
        parts = list(parts)
        for i, (p, (pos, k, v)) in enumerate(zip(self.pools, parts, strict=True)):
            if p.n_available(seq) < len(pos):
                p._reclaim_outside_windows()
            if p.n_available(seq) < len(pos) and p.window is not None and len(pos):
                # a smaller windowed pool than the writer's: keep what the next token (or the last one,
                # evaluated again) can attend to; a shorter reuse recomputes from the start
                keep = pos >= pos[-1] + 1 - p.window
                pos = pos[keep]
                parts[i] = (pos, k[:, keep], v[:, keep])
            if p.n_available(seq) < len(pos):
                raise KVCacheFullError(
                    f"the KV cache has {p.n_available(seq)} cells for this slot, the state needs {len(pos)}"
                )
        self.seq_rm(seq)
        for p, (pos, k, v) in zip(self.pools, parts, strict=True):
            p.seq_import(seq, pos, k, v)

    def reusable_prefix(self, seq: int, n_tokens: int) -> int:
        """How many of the first `n_tokens` positions of `seq` can be kept: every pool must cover them."""
        n = min(n_tokens, self.seq_pos_max(seq) + 1)
        while n > 0 and not all(p.covers(seq, n) for p in self.pools):
            n = 0  # a windowed pool lost the window: recompute from the start, as llama.cpp does
        return n
