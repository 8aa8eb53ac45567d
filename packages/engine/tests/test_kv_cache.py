"""KVCache bookkeeping: placement, ranges, removal, sharing, shifting, windows, unsharing."""

from __future__ import annotations

import numpy as np
import pytest

from llama_engine.batch import Batch
from llama_engine.kv_cache import CellPool, KVCache, KVCacheFullError


def _place(pool: CellPool, seq: int, positions: range) -> np.ndarray:
    return pool.place(np.full(len(positions), seq, np.int32), np.asarray(positions, np.int32))


def test_place_and_causal_ranges() -> None:
    pool = CellPool(16, [0], 4, None)
    _place(pool, 0, range(0, 3))
    _place(pool, 1, range(0, 2))
    seq = np.array([0, 0, 1], np.int32)
    pos = np.array([3, 4, 2], np.int32)
    cells = pool.place(seq, pos)
    r = pool.ranges(seq, pos)
    # token (0, pos 3) sees positions 0..3 of seq 0; (0, 4) sees 0..4; (1, 2) sees 0..2 of seq 1
    assert [list(pool.pos[r.cells[r.lo[t] : r.hi[t]]]) for t in range(3)] == [
        [0, 1, 2, 3],
        [0, 1, 2, 3, 4],
        [0, 1, 2],
    ]
    assert set(cells) & set(pool.seq_cells(1)) == {cells[2]}


def test_windowed_ranges_and_reclaim() -> None:
    pool = CellPool(6, [0], 4, window=3)
    _place(pool, 0, range(0, 5))
    r = pool.ranges(np.array([0], np.int32), np.array([4], np.int32))
    assert list(pool.pos[r.cells[r.lo[0] : r.hi[0]]]) == [2, 3, 4]  # p - pos < 3
    _place(pool, 0, range(5, 8))  # needs 3 cells, 1 free: reclaims positions no token can see again
    assert sorted(pool.pos[pool.seq_cells(0)]) == [3, 4, 5, 6, 7]


def test_a_pinned_sequence_keeps_its_cells_outside_the_window() -> None:
    """A held step's sequence is pinned (`KVCache.pin`): reclaiming cells outside the window passes it
    by."""
    kv = KVCache(n_ctx=16, n_layer=1, kv_dim=4, swa_layers=frozenset({0}), window=3, swa_full=True)
    pool = kv.pools[0]
    assert isinstance(pool, CellPool)
    _place(pool, 0, range(0, 8))
    _place(pool, 1, range(0, 8))
    kv.pin({0})
    pool._reclaim_outside_windows()
    assert len(pool.seq_cells(0)) == 8 and sorted(pool.pos[pool.seq_cells(1)]) == [6, 7]
    kv.pin(frozenset())
    pool._reclaim_outside_windows()
    assert sorted(pool.pos[pool.seq_cells(0)]) == [6, 7]


def test_seq_rm_frees_cells_only_when_no_sequence_sees_them() -> None:
    pool = CellPool(8, [0], 4, None)
    _place(pool, 0, range(0, 4))
    pool.seq_cp(0, 1, 0, 2)
    pool.seq_rm(0)
    assert pool.n_free == 6  # positions 0-1 are still seen by sequence 1
    assert list(pool.pos[pool.seq_cells(1)]) == [0, 1]
    pool.seq_rm(1, 1)
    assert pool.n_free == 7


def test_seq_add_shifts_positions_and_rotates_keys() -> None:
    pool = CellPool(8, [0], 4, None)
    cells = _place(pool, 0, range(0, 6))
    pool.k[0][cells] = np.arange(24, dtype=np.float32).reshape(6, 4)
    calls = []
    pool.seq_rm(0, 1, 3)
    pool.seq_add(0, 3, -1, -2, lambda il, k, c, d: calls.append((il, sorted(pool.pos[c].tolist()), d)))
    assert calls == [(0, [3, 4, 5], -2)]
    assert list(pool.pos[pool.seq_cells(0)]) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="negative"):
        pool.seq_add(0, 0, -1, -1, lambda *a: None)


def test_unshare_copies_shared_cells() -> None:
    pool = CellPool(8, [0], 4, None)
    cells = _place(pool, 0, range(0, 3))
    pool.k[0][cells] = 1.0
    pool.seq_cp(0, 1)
    pool.seq_unshare(1)
    assert not set(pool.seq_cells(0)) & set(pool.seq_cells(1))
    assert (pool.k[0][pool.seq_cells(1)] == 1.0).all()


def test_full_cache_is_all_or_nothing() -> None:
    kv = KVCache(8, 2, 4, frozenset({1}), window=2, n_seq_max=1, n_ubatch=6)
    kv.place(Batch.single(list(range(6)), 0))
    with pytest.raises(KVCacheFullError):
        kv.place(Batch.single(list(range(5)), 0, 6))
    assert kv.pools[0].n_free == 2
    assert all(p.seq_pos_max(0) == 5 for p in kv.pools)  # nothing of the failed batch was placed


def test_reusable_prefix_respects_windows() -> None:
    kv = KVCache(64, 2, 4, frozenset({1}), window=4, n_seq_max=1, n_ubatch=10)
    kv.place(Batch.single(list(range(10)), 0))
    assert kv.reusable_prefix(0, 8) == 8
    kv.pools[1].seq_rm(0, 0, 5)  # the windowed pool lost positions 0-4
    assert kv.reusable_prefix(0, 10) == 10  # positions 6..9 are still there for a token at 10
    assert kv.reusable_prefix(0, 6) == 0  # a token at 6 needs 3..5: gone, so recompute


def test_cache_types_f16_default_f32_and_unsupported() -> None:
    kv = KVCache(8, 2, 4)
    assert kv.pools[0].k[0].dtype == np.float16 and kv.pools[0].v[1].dtype == np.float16
    kv32 = KVCache(8, 2, 4, type_k="f32", type_v="f16")
    assert kv32.pools[0].k[0].dtype == np.float32 and kv32.pools[0].v[0].dtype == np.float16
    assert kv32.nbytes == 2 * 8 * 4 * (4 + 2)
    # stores round to nearest even, as ggml's f32 -> f16 copy
    x = np.array([1.0 + 2**-11, 1.0 + 3 * 2**-11, 65520.0, -1e-8], np.float32)
    with np.errstate(over="ignore"):  # 65520 rounds up to f16's infinity, as in ggml
        kv.pools[0].k[0][0] = x
    assert kv.pools[0].k[0][0].tolist() == [1.0, 1.0 + 2**-9, float("inf"), -0.0]
    with pytest.raises(ValueError, match=r"Unsupported cache type: q2_k \(allowed values: f32, f16, bf16"):
        KVCache(8, 2, 4, type_k="q2_k")
