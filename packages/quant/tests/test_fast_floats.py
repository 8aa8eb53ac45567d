"""The fast float kernels (``fast_floats``: F16, BF16, F32 with f32 sums in vector lanes) against an f64
product, the exact kernels and themselves: batch sizes, kernel sets, the mode's switch."""

from __future__ import annotations

import numpy as np
import pytest
from exact_cases import make_acts, weights
from gguf import GGMLQuantizationType as T

import llama_quant
from llama_quant.cpu import EXACT_ENV_VAR, KernelSet, host_kernel_set, resolve_exact_floats
from llama_quant.kernels import ExactMatrix

KERNEL_SETS = [k for k in KernelSet if k <= host_kernel_set()]
FLOATS = [T.F16, T.BF16, T.F32]


def _rounded(x: np.ndarray, qtype: T) -> np.ndarray:
    """The activations as the weights' vec_dot type holds them (f16 / bf16 rounding; f32 unchanged)."""
    if qtype == T.F16:
        return x.astype(np.float16).astype(np.float64)
    if qtype == T.BF16:
        bits = x.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16  # round to nearest even
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


@pytest.mark.parametrize("kernels", KERNEL_SETS, ids=lambda k: k.name)
@pytest.mark.parametrize("qtype", FLOATS, ids=lambda t: t.name)
@pytest.mark.parametrize("kind", ["normal", "outliers", "zeros"])
def test_f32_sums_are_within_their_rounding_of_the_f64_product(
    qtype: T, kernels: KernelSet, kind: str
) -> None:
    """Each output is the f64 product of the rounded activations and the weights up to f32 rounding of a
    running sum: at most cols * 2^-24 of the sum of the products' magnitudes."""
    rows, cols = 70, 512  # a partial last tile
    raw = weights(qtype, rows, cols, seed=int(qtype))
    m = ExactMatrix(raw, qtype, rows, cols, kernels, exact=False)
    assert not m.exact
    w = llama_quant.dequantize(raw, qtype, (rows, cols)).astype(np.float64)
    x = make_acts(kind, 17, cols, seed=3)
    xr = _rounded(x, qtype)
    want, scale = xr @ w.T, np.abs(xr) @ np.abs(w).T
    bound = cols * 2.0**-24 * scale + 1e-30
    for n in (1, 2, 3, 4, 5, 9, 17):  # every pass shape: one, two, four tokens
        got = m.matmul(x[:n]).astype(np.float64)
        assert np.all(np.abs(got - want[:n]) <= bound[:n]), n


@pytest.mark.parametrize("qtype", FLOATS, ids=lambda t: t.name)
def test_batches_and_kernel_sets_give_the_same_numbers(qtype: T) -> None:
    """Token t's outputs do not depend on the batch around it, nor on the kernel set (fp16 tiles from AVX2
    on, f32 tiles in the portable set: the same widened values, the same sums)."""
    rows, cols = 130, 768
    raw = weights(qtype, rows, cols, seed=1)
    x = make_acts("mixed", 11, cols, seed=2)
    results = []
    for ks in KERNEL_SETS:
        m = ExactMatrix(raw, qtype, rows, cols, ks, exact=False)
        full = m.matmul(x)
        for a, b in ((0, 1), (1, 5), (5, 7), (7, 11)):
            assert np.array_equal(m.matmul(x[a:b]), full[a:b]), (ks, a, b)
        assert np.array_equal(m.matvec(x[4]), full[4])
        results.append(full)
    for other in results[1:]:
        assert np.array_equal(other, results[0])


@pytest.mark.parametrize("qtype", FLOATS, ids=lambda t: t.name)
def test_exact_mode_keeps_the_portable_bits_and_quantized_types_are_unaffected(qtype: T) -> None:
    rows, cols = 64, 256
    raw = weights(qtype, rows, cols, seed=4)
    x = make_acts("normal", 3, cols, seed=5)
    exact = ExactMatrix(raw, qtype, rows, cols, exact=True)
    fast = ExactMatrix(raw, qtype, rows, cols, exact=False)
    assert exact.exact and not fast.exact
    assert not np.array_equal(exact.matmul(x), fast.matmul(x))  # f64 and f32 sums round differently
    q = weights(T.Q8_0, rows, cols, seed=4)
    assert np.array_equal(
        ExactMatrix(q, T.Q8_0, rows, cols, exact=True).matmul(x),
        ExactMatrix(q, T.Q8_0, rows, cols, exact=False).matmul(x),
    )


def test_the_mode_comes_from_the_argument_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EXACT_ENV_VAR, raising=False)
    assert resolve_exact_floats(None) is False
    assert resolve_exact_floats(True) is True
    for value, want in (("1", True), ("yes", True), ("ON", True), ("0", False), ("false", False)):
        monkeypatch.setenv(EXACT_ENV_VAR, value)
        assert resolve_exact_floats(None) is want
        assert resolve_exact_floats(not want) is (not want)
    monkeypatch.setenv(EXACT_ENV_VAR, "maybe")
    with pytest.raises(ValueError, match="LLAMA_EXACT_FLOATS"):
        resolve_exact_floats(None)
