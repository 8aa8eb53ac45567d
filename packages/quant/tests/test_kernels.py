"""Kernels vs their numpy references and vs exact float64 products (gguf-py's dequantization).

Tolerances (eps = 2**-24, the f32 unit roundoff):

* Kernel vs ``ref`` (same quantized activations, f64 product): the integer block sums are exact, so the
  only differences are f32 roundings of the scale products and of the sum over the k terms a row adds up
  (k = cols / block, or cols for float weights and the BLAS path). A sum of k terms in f32 is within
  ``k * eps * sum|terms|`` of the exact sum whatever the order (fastmath may reorder), so we allow
  ``(k + 8) * eps * sum_i |w_i x_i|`` per row, the 8 covering the rounding of the scale products.

* Kernel vs exact ``W @ x`` in f64, integer path: the activation quantization dominates. Each block of x
  is stored as q * d with d = amax / 127 and q = round(x / d), so |x_i - q_i d| <= d / 2 (plus f32
  rounding of x / d, < 1e-5 of a step). Hence, with no cancellation assumed,
  ``|y - W @ x| <= sum_blocks (amax_b / 254) * (1 + 1e-4) * sum_{i in b} |w_i|`` per row: a worst-case,
  per-row bound, about 1/254 of the row's weighted activation magnitude, not an empirical tolerance.
  The float rounding bound above is added to it.

* BLAS path (batches above BLAS_MIN_TOKENS) and float weights: activations stay f32, so only the float
  bound applies, with k = cols: several hundred times tighter than the quantized bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from llama_quant import kernels
from llama_quant.kernels import ref
from llama_quant.kernels.matrix import _SPECS, BLAS_MIN_TOKENS

EPS = 2.0**-24
LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
KTYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
FLOATS = [T.F16, T.BF16, T.F32]
ALL = LEGACY + KTYPES + FLOATS
# byte offsets of the f16 scale fields in each K block (random bytes there could be inf/nan)
_K_F16 = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_raw(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw ggml bytes of a random rows x cols matrix: quantized by gguf-py where it can, else random blocks
    (every bit pattern is a valid K block once its f16 scales are finite)."""
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if qtype == T.F32:
        return w.view(np.uint8).reshape(rows, -1)
    if qtype == T.F16:
        return w.astype(np.float16).view(np.uint8).reshape(rows, -1)
    if qtype in LEGACY or qtype == T.BF16:
        return quants.quantize(w, qtype)
    spec = _SPECS[qtype]
    nb = cols // 256
    raw = rng.integers(0, 256, (rows, nb, spec.block_bytes), dtype=np.uint8)
    for off in _K_F16[qtype]:
        d = (rng.random((rows, nb)) * 0.01 + 0.001).astype(np.float16)
        raw[:, :, off : off + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, -1)


def float_bound(qtype: T, w: np.ndarray, x: np.ndarray, blas: bool) -> np.ndarray:
    """(k + 8) eps sum|w x| per [token, row] (see module doc)."""
    cols = w.shape[1]
    k = cols if (blas or _SPECS[qtype].act == "f32") else cols // _SPECS[qtype].block
    return (k + 8) * EPS * (np.abs(x) @ np.abs(w).T)


def quant_bound(qtype: T, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """sum_b amax_b / 254 * (1 + 1e-4) * sum_{i in b} |w_i| per [token, row] (see module doc)."""
    block = 32 if _SPECS[qtype].act == "q8_0" else 256
    n = x.shape[0]
    amax = np.abs(x.astype(np.float64)).reshape(n, -1, block).max(axis=-1)  # [n, nblocks]
    wsum = np.abs(w).reshape(w.shape[0], -1, block).sum(axis=-1)  # [rows, nblocks]
    return amax / 254 * (1 + 1e-4) @ wsum.T


def check(qtype: T, raw: np.ndarray, rows: int, cols: int, x: np.ndarray, w_exact: np.ndarray) -> None:
    """Kernel vs ref (float bound) and vs exact f64 (quantization + float bound) for one batch x."""
    n = x.shape[0]
    blas = n > BLAS_MIN_TOKENS or _SPECS[qtype].act == "f32"
    m = kernels.QuantMatrix(raw, qtype, rows, cols)
    got = m.matmul(x) if n > 1 else m.matvec(x[0]).reshape(1, rows)
    want = np.empty((n, rows))
    ref.matmul(want, raw, qtype, rows, cols, x)
    fb = float_bound(qtype, w_exact, x, blas)
    assert np.all(np.abs(got - want) <= fb), (
        f"{qtype.name}: kernel vs ref {np.max(np.abs(got - want) / fb):.3g}x bound"
    )
    exact = x.astype(np.float64) @ w_exact.T
    bound = fb if blas else quant_bound(qtype, w_exact, x) + fb
    assert np.all(np.abs(got - exact) <= bound), (
        f"{qtype.name}: vs exact {np.max(np.abs(got - exact) / bound):.3g}x bound"
    )


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_ref_dequantize_matches_gguf(qtype: T) -> None:
    rng = np.random.default_rng(1)
    rows, cols = 8, 512
    raw = random_raw(qtype, rows, cols, rng)
    got = ref.dequantize(raw, qtype, rows, cols)
    want = quants.dequantize(raw, qtype).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 3, BLAS_MIN_TOKENS + 5])
def test_random_matrix(qtype: T, n: int) -> None:
    # rows not a multiple of the 64-row tile, several super-blocks per row
    rng = np.random.default_rng(int(qtype) * 10 + n)
    rows, cols = 200, 768
    raw = random_raw(qtype, rows, cols, rng)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, 5] = 40.0  # an outlier, as real activations have
    check(qtype, raw, rows, cols, x, quants.dequantize(raw, qtype).astype(np.float64))


def test_zero_activation_block() -> None:
    rng = np.random.default_rng(3)
    raw = random_raw(T.Q4_0, 64, 256, rng)
    x = rng.standard_normal(256).astype(np.float32)
    x[:32] = 0.0
    check(T.Q4_0, raw, 64, 256, x[None], quants.dequantize(raw, T.Q4_0).astype(np.float64))


def test_activations_shared_and_out_param() -> None:
    rng = np.random.default_rng(4)
    cols = 512
    mats = [
        kernels.QuantMatrix(random_raw(t, 128, cols, rng), t, 128, cols) for t in (T.Q4_0, T.Q4_K, T.Q8_0)
    ]
    x = rng.standard_normal((2, cols)).astype(np.float32)
    acts = kernels.Activations(cols, max_tokens=4).set(x)
    for m in mats:
        out = np.full((2, 128), np.nan, np.float32)
        assert m.matmul(acts, out) is out
        np.testing.assert_array_equal(out, m.matmul(x))
    y = np.empty(128, np.float32)
    assert mats[0].matvec(x[0], out=y) is y
    np.testing.assert_array_equal(y, mats[0].matmul(x[:1])[0])


def test_functional_entry_points_match_ref() -> None:
    rng = np.random.default_rng(5)
    raw = random_raw(T.Q6_K, 96, 512, rng)
    x = rng.standard_normal(512).astype(np.float32)
    got, want = np.empty(96, np.float32), np.empty(96)
    kernels.matvec(got, raw, T.Q6_K, 96, 512, x)
    ref.matvec(want, raw, T.Q6_K, 96, 512, x)
    w = ref.dequantize(raw, T.Q6_K, 96, 512)
    assert np.all(np.abs(got - want) <= float_bound(T.Q6_K, w, x[None], False)[0])
    gotm = np.empty((2, 96), np.float32)
    kernels.matmul(gotm, raw, T.Q6_K, 96, 512, np.stack([x, x]))
    np.testing.assert_array_equal(gotm[0], got)


def test_bad_shapes() -> None:
    with pytest.raises(ValueError, match="divisible"):
        kernels.QuantMatrix(np.zeros(100, np.uint8), T.Q4_K, 4, 100)
    with pytest.raises(ValueError, match="bytes"):
        kernels.QuantMatrix(np.zeros(100, np.uint8), T.Q4_0, 4, 64)
    m = kernels.QuantMatrix(np.zeros(64 * 18, np.uint8), T.Q4_0, 64, 32)
    with pytest.raises(ValueError, match="out must be"):
        m.matvec(np.zeros(32, np.float32), out=np.zeros(63, np.float32))
    with pytest.raises(ValueError, match="out must be"):
        m.matmul(np.zeros((2, 32), np.float32), out=np.zeros((2, 64), np.float64))
    with pytest.raises(ValueError, match="columns"):
        m.matvec(kernels.Activations(16).set(np.zeros(16, np.float32)))
    with pytest.raises(ValueError):
        m.matvec(np.zeros(31, np.float32))
    with pytest.raises(ValueError, match="no kernel"):
        kernels.QuantMatrix(np.zeros(100, np.uint8), T.IQ2_XXS, 4, 256)
    assert {*LEGACY, *KTYPES, *FLOATS} == set(kernels.SUPPORTED_TYPES)


def test_warmup_runs_every_path() -> None:
    kernels.warmup()  # compiles (or loads from numba's cache) every kernel; must not raise
