"""ops.attention: equal to its numpy reference for both register-tile widths; a token's numbers do not
depend on the batch around it (prompt blocks take the many-lane path, single tokens the few-lane one), for
mixed sequences, sliding windows, grouped heads and both cache types; and the f16 cache rounds as ggml
does."""

from __future__ import annotations

import numpy as np
import pytest

from llama_engine import ops
from llama_engine.ops import ref
from llama_engine.ops.expf import expf_sse2
from llama_quant.cpu import KernelSet


def _ranges(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Three sequences in one batch: a prompt chunk after 380 cached cells, a windowed sequence (window
    50) continuing at 250, and single decode tokens of a third one, cells scattered over the cache."""
    n_cells = 1000
    cells = rng.permutation(n_cells).astype(np.int32)
    lo = np.empty(n, np.int32)
    hi = np.empty(n, np.int32)
    a, b = n // 2, n // 2 + n // 3
    for t in range(a):  # sequence A: cells[0:400]
        lo[t], hi[t] = 0, 380 - a + t + 1
    for t in range(a, b):  # sequence B: cells[400:700], window 50
        hi[t] = 400 + 250 + (t - a) + 1
        lo[t] = max(400, hi[t] - 50)
    for t in range(b, n):  # sequence C: cells[700:1000], one decode token each (same position)
        lo[t], hi[t] = 700, 700 + 200
    return cells, lo, hi, n_cells


@pytest.mark.parametrize("kv_type", [np.float32, np.float16])
@pytest.mark.parametrize(
    ("n_head", "n_head_kv", "head_dim"), [(9, 3, 64), (4, 1, 256), (4, 2, 16), (2, 2, 24), (6, 1, 20)]
)
def test_batched_equals_one_token_at_a_time(
    n_head: int, n_head_kv: int, head_dim: int, kv_type: type
) -> None:
    rng = np.random.default_rng(head_dim)
    n = 41
    cells, lo, hi, n_cells = _ranges(n, rng)
    k = rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(kv_type)
    v = rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(kv_type)
    q = rng.standard_normal((n, n_head * head_dim)).astype(np.float32)
    batched = np.empty((n, n_head * head_dim), np.float32)
    ops.attention(batched, q, k, v, cells, lo, hi, n, n_head, n_head_kv, head_dim, 0.125)
    for t in range(n):
        one = np.empty((1, n_head * head_dim), np.float32)
        ops.attention(
            one,
            q[t : t + 1],
            k,
            v,
            cells,
            lo[t : t + 1],
            hi[t : t + 1],
            1,
            n_head,
            n_head_kv,
            head_dim,
            0.125,
        )
        np.testing.assert_array_equal(one[0], batched[t])


def test_no_tokens_no_jobs() -> None:
    """A batch without tokens: nothing is written, nothing fails."""
    k = v = np.ones((4, 64), np.float16)
    out = np.full((1, 128), 7.0, np.float32)
    no = np.zeros(0, np.int32)
    ops.attention(out[:0], out[:0], k, v, np.arange(4, dtype=np.int32), no, no, 0, 2, 1, 64, 0.125)
    assert (out == 7.0).all()


def test_f16_cache_rounds_queries_and_probabilities() -> None:
    """With f16 K/V, q and the probabilities are rounded to f16 (ggml converts mul_mat's src1 to the
    weights' vec_dot type): the result is the f32-cache result on those rounded operands."""
    rng = np.random.default_rng(0)
    n, n_cells, d = 5, 64, 32
    k = rng.standard_normal((n_cells, d)).astype(np.float16)
    v = rng.standard_normal((n_cells, d)).astype(np.float16)
    q = rng.standard_normal((n, d)).astype(np.float32)
    cells = np.arange(n_cells, dtype=np.int32)
    lo, hi = np.zeros(n, np.int32), np.full(n, n_cells, np.int32)
    out16 = np.empty((n, d), np.float32)
    ops.attention(out16, q, k, v, cells, lo, hi, n, 1, 1, d, 0.2)
    out32 = np.empty((n, d), np.float32)
    q16 = q.astype(np.float16).astype(np.float32)
    ops.attention(out32, q16, k.astype(np.float32), v.astype(np.float32), cells, lo, hi, n, 1, 1, d, 0.2)
    assert not np.array_equal(out16, out32)  # the probabilities' rounding shows
    np.testing.assert_allclose(out16, out32, rtol=0, atol=2e-3)


@pytest.mark.parametrize("tile_cols", ops.TILE_WIDTHS)
@pytest.mark.parametrize("kv_type", [np.float32, np.float16])
@pytest.mark.parametrize(("n_head", "n_head_kv", "head_dim"), [(9, 3, 64), (4, 2, 16), (6, 1, 20)])
def test_each_tile_width_equals_the_reference(
    n_head: int, n_head_kv: int, head_dim: int, kv_type: type, tile_cols: int
) -> None:
    """Both many-lane tile widths (4 columns for AVX2 hosts, 8 for AVX-512 ones) run on any host and give
    the numpy reference's numbers, for prompt blocks (many lanes) and single decode tokens (few lanes)."""
    rng = np.random.default_rng(head_dim + tile_cols)
    n = 23
    cells, lo, hi, n_cells = _ranges(n, rng)
    k = rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(kv_type)
    v = rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(kv_type)
    q = rng.standard_normal((n, n_head * head_dim)).astype(np.float32)
    got = np.empty((n, n_head * head_dim), np.float32)
    ops.attention(got, q, k, v, cells, lo, hi, n, n_head, n_head_kv, head_dim, 0.125, tile_cols)
    want = np.empty_like(got)
    ref.attention(want, q, k, v, cells, lo, hi, n, n_head, n_head_kv, head_dim, 0.125)
    np.testing.assert_array_equal(got, want)


def test_tile_width_follows_the_kernel_set() -> None:
    assert ops.tiles_for(KernelSet.AVX512) == 8
    assert ops.tiles_for(KernelSet.AVX2) == ops.tiles_for(KernelSet.PORTABLE) == 4
    with pytest.raises(ValueError, match="tile_cols"):
        z = np.zeros((1, 4), np.float32)
        ops.attention(z, z, z, z, np.zeros(1, np.int32), *np.zeros((2, 1), np.int32), 1, 1, 1, 4, 1.0, 6)


def test_expf_reference_matches_the_kernel_off_the_main_path() -> None:
    x = np.concatenate([np.linspace(-200, 100, 3001), [-88.5, -87.0, 88.0, -126.5 * np.log(2)]]).astype(
        np.float32
    )
    with np.errstate(over="ignore"):
        want = np.array([expf_sse2(np.float32(v)) for v in x], np.float32)
    np.testing.assert_array_equal(ref.expf(x), want)


@pytest.mark.parametrize("tile_cols", ops.TILE_WIDTHS)
@pytest.mark.parametrize("kv_type", [np.float32, np.float16])
def test_sinks_equal_the_reference(kv_type: type, tile_cols: int) -> None:
    """Attention sinks (gpt-oss): a per-head logit in the softmax's maximum and sum, below and above the
    rows' scores, for prompt blocks and single tokens; without them the numbers are the plain softmax's."""
    n_head, n_head_kv, head_dim, n = 6, 2, 16, 23
    rng = np.random.default_rng(31)
    cells, lo, hi, n_cells = _ranges(n, rng)
    k = rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(kv_type)
    v = rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(kv_type)
    q = (rng.standard_normal((n, n_head * head_dim)) * 2).astype(np.float32)
    sinks = np.array([-40.0, -1.0, 0.5, 2.0, 8.0, 60.0], np.float32)  # the last exceeds every score
    got = np.empty((n, n_head * head_dim), np.float32)
    ops.attention(got, q, k, v, cells, lo, hi, n, n_head, n_head_kv, head_dim, 0.25, tile_cols, sinks)
    want = np.empty_like(got)
    ref.attention(want, q, k, v, cells, lo, hi, n, n_head, n_head_kv, head_dim, 0.25, sinks)
    np.testing.assert_array_equal(got, want)
    plain = np.empty_like(got)
    ops.attention(plain, q, k, v, cells, lo, hi, n, n_head, n_head_kv, head_dim, 0.25, tile_cols)
    assert (got[:, :head_dim] == plain[:, :head_dim]).all()  # a sink of -40 adds nothing to the sum
    assert not np.allclose(got[:, 3 * head_dim :], plain[:, 3 * head_dim :])
