"""The i-quant and ternary kernels (``llama_quant.kernels.iquants``) against their numpy references, bit for
bit, in every kernel set this host runs; the references' integers against the dequantizers. The parity
tests against llama.cpp's own kernels live in test_iq_parity.py."""

from __future__ import annotations

import numpy as np
import pytest
from exact_cases import make_acts
from gguf import GGMLQuantizationType as T
from iq_cases import IQ_TYPES, iq_weights, random_blocks

import llama_quant
from llama_quant.cpu import KernelSet, host_kernel_set
from llama_quant.kernels import SUPPORTED_TYPES, ExactMatrix, ref
from llama_quant.kernels.iquants import GRID_KINDS

KERNEL_SETS = [k for k in KernelSet if k <= host_kernel_set()]
_name = lambda t: t.name  # noqa: E731


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def test_every_type_llama_quant_writes_has_a_kernel() -> None:
    assert set(IQ_TYPES) <= SUPPORTED_TYPES
    assert set(llama_quant.quantize_types()) <= SUPPORTED_TYPES


@pytest.mark.parametrize("kernels", KERNEL_SETS, ids=_name)
@pytest.mark.parametrize("qtype", IQ_TYPES, ids=_name)
def test_kernel_matches_reference(qtype: T, kernels: KernelSet) -> None:
    rows, cols = 70, 512  # a partial last tile, two super-blocks
    for seed, kind in ((0, "normal"), (1, "outliers"), (2, "zeros"), (3, "ties")):
        raw = iq_weights(qtype, rows, cols, seed=seed + int(qtype))
        m = ExactMatrix(raw, qtype, rows, cols, kernels)
        x = make_acts(kind, 5, cols, seed=int(qtype))
        want = np.empty((5, rows), np.float32)
        ref.matmul(want, raw, qtype, rows, cols, x)
        assert _same(m.matmul(x), want), kind
        assert _same(m.matvec(x[3]), want[3]), kind


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=_name)
def test_extreme_quants_fit_the_integer_sums(qtype: T) -> None:
    """Every quant byte at 0xFF or 0x00 (the largest grid values, kvalues -127 / 113, +-1 trits) against
    activations at +-127: the int16 pair sums must not wrap."""
    rows, cols = 64, 256
    raw = random_blocks(qtype, rows, cols, seed=5).reshape(rows, -1)
    fill = raw.copy()
    half = raw.shape[1] // 2
    fill[:32] = 0xFF
    fill[32:, :half] = 0
    # keep the scales sane: copy back the scale bytes of the random blocks
    want_d = ref.decode(raw, qtype, rows, cols)["d"]
    for o in range(fill.shape[1]):
        trial = fill.copy()
        trial[:, o] = raw[:, o]
        if not np.array_equal(
            ref.decode(trial, qtype, rows, cols)["d"], ref.decode(fill, qtype, rows, cols)["d"]
        ):
            fill[:, o] = raw[:, o]
    assert np.array_equal(ref.decode(fill, qtype, rows, cols)["d"], want_d)
    x = np.full((3, cols), 1000.0, np.float32)
    x[1] = -1000.0
    x[2, ::2] = -1000.0
    want = np.empty((3, rows), np.float32)
    ref.matmul(want, fill, qtype, rows, cols, x)
    for kernels in KERNEL_SETS:
        assert _same(ExactMatrix(fill, qtype, rows, cols, kernels).matmul(x), want), kernels.name


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=_name)
def test_reference_integers_rebuild_the_dequantized_weights(qtype: T) -> None:
    """The integers and scales the products use, times the block scale, are the dequantizer's weights
    (up to its own rounding): the decoding reads the bits the format defines."""
    rows, cols = 8, 512
    raw = random_blocks(qtype, rows, cols, seed=11)
    dec = ref.decode(raw, qtype, rows, cols)
    nb = dec["q"].shape[1]
    q = dec["q"].astype(np.float64)
    if "delta" in dec:
        q = q + 0.125 * np.repeat(dec["delta"], 8, axis=-1)
    if "sc" in dec:
        q = q * np.repeat(dec["sc"], q.shape[-1] // dec["sc"].shape[-1], axis=-1)
    factor = {T.IQ2_XXS: 0.125, T.IQ2_XS: 0.125, T.IQ2_S: 0.125, T.IQ3_XXS: 0.25}.get(qtype, 1.0)
    w = (q * dec["d"][..., None].astype(np.float64) * factor).reshape(rows, nb * q.shape[-1])
    got = llama_quant.dequantize(raw, qtype, (rows, cols)).astype(np.float64)
    assert np.allclose(got, w, rtol=1e-6, atol=0), qtype.name
    assert qtype in GRID_KINDS or qtype in (T.IQ4_NL, T.IQ4_XS, T.MXFP4)


def test_mxfp4_scales_fp16_cannot_hold_stay_exact() -> None:
    """MXFP4's e8m0 scales span 2^-128 .. 2^127; the kernels keep them in f32 (fp16 holds 2^-24 .. 2^15)."""
    rows, cols = 64, 256
    raw = random_blocks(T.MXFP4, rows, cols, seed=2).reshape(-1, 17)
    raw[:, 0] = np.arange(len(raw)) % 256
    raw = raw.reshape(-1)
    x = make_acts("normal", 2, cols)
    d = ref.decode(raw, T.MXFP4, rows, cols)["d"]
    assert d.max() > 65504 and d.min() < 2.0**-24
    want = np.empty((2, rows), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        ref.matmul(want, raw, T.MXFP4, rows, cols, x)
    for kernels in KERNEL_SETS:
        assert _same(ExactMatrix(raw, T.MXFP4, rows, cols, kernels).matmul(x), want)


@pytest.mark.parametrize(
    "parts",
    [[T.IQ4_NL, T.Q8_0], [T.IQ4_NL, T.Q5_0, T.Q8_0], [T.IQ4_XS, T.IQ4_XS]],
    ids=lambda p: "+".join(t.name for t in p),
)
def test_stacked_rows_equal_each_matrix(parts: list[T]) -> None:
    """IQ4_NL rows stack with Q5_0 and Q8_0 ones (all widened to Q8_0): each part's own numbers."""
    cols = 512
    raws = [(iq_weights(q, 64 + 8 * i, cols, seed=2 * i), q, 64 + 8 * i) for i, q in enumerate(parts)]
    m = ExactMatrix.stacked(raws, cols)
    assert m is not None
    x = make_acts("normal", 3, cols)
    want = np.concatenate([ExactMatrix(r, q, n, cols).matmul(x) for r, q, n in raws], axis=1)
    assert _same(m.matmul(x), want)
