"""Byte-identical quantization against llama.cpp's ggml_quantize_chunk (run by the nox 'parity' session)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from conftest import MATRIX_KINDS, make_imatrix, make_matrix

import llama_quant as lq

pytestmark = [pytest.mark.parity, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

QUANTIZE = [t for t in lq.QUANTIZE_TYPES if t != gguf.GGMLQuantizationType.F32]
# ggml's grid searches assert (abort the process) when NaN makes every neighbour's distance NaN
_NAN_ABORTS = {
    getattr(gguf.GGMLQuantizationType, n) for n in ("IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_M")
}


def _cols(qtype) -> list[int]:
    bs = lq.block_size(qtype)
    return [768] if bs == 256 else [768, 96]


@pytest.mark.parametrize("kind", MATRIX_KINDS)
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("qtype", QUANTIZE, ids=lambda t: t.name)
def test_quantize_matches_ggml(ggml, qtype, weighted, kind):
    for seed, cols in enumerate(_cols(qtype)):
        x = make_matrix(kind, 6, cols, seed=seed)
        qw = make_imatrix(cols, seed=seed) if weighted else None
        if qw is None and lq.requires_imatrix(qtype):  # ggml asserts; we refuse
            with pytest.raises(ValueError, match="requires an importance matrix"):
                lq.quantize(x, qtype)
            continue
        ours = lq.quantize(x, qtype, imatrix=qw)
        theirs = ggml.quantize(x, qtype, qw)
        assert ours.dtype == np.uint8
        assert np.array_equal(ours, theirs), (
            f"{qtype.name} {kind} first difference at {np.flatnonzero(ours != theirs)[:8]}"
        )
        # and the bytes read back exactly as gguf-py reads them
        back = lq.dequantize(ours, qtype, x.shape)
        ref = gguf.quants.dequantize(ours.reshape(x.shape[0], -1), qtype)
        assert np.array_equal(back, ref, equal_nan=True)


@pytest.mark.parametrize("qtype", QUANTIZE, ids=lambda t: t.name)
def test_quantize_many_rows(ggml, qtype):
    # more rows than threads, so that the parallel row split is exercised
    x = make_matrix("normal", 67, 512, seed=7)
    qw = make_imatrix(512, seed=7)
    if not lq.requires_imatrix(qtype):  # ggml asserts without one
        assert np.array_equal(lq.quantize(x, qtype), ggml.quantize(x, qtype))
    assert np.array_equal(lq.quantize(x, qtype, imatrix=qw), ggml.quantize(x, qtype, qw))


def test_sizes_and_requires_imatrix_match_ggml(ggml):
    for t in lq.DEQUANTIZE_TYPES:
        assert lq.row_nbytes(t, 512) == ggml.row_size(t, 512), t.name
        assert lq.requires_imatrix(t) == ggml.requires_imatrix(t), t.name


def test_f32_copy(ggml):
    x = make_matrix("normal", 3, 64)
    assert np.array_equal(lq.quantize(x, "f32"), ggml.quantize(x, gguf.GGMLQuantizationType.F32))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("qtype", [t for t in QUANTIZE if t not in _NAN_ABORTS], ids=lambda t: t.name)
def test_non_finite_weights_match_ggml(ggml, qtype):
    # NaN / inf weights: not meaningful, but the bytes still follow the C code
    x = make_matrix("normal", 4, 512, seed=11)
    x[0, 3] = np.nan
    x[1, 100] = np.inf
    x[2, 7] = -np.inf
    x[3, 300:310] = np.nan
    x[3, 511] = np.nan
    qw = make_imatrix(512, seed=11)
    if not lq.requires_imatrix(qtype):
        assert np.array_equal(lq.quantize(x, qtype), ggml.quantize(x, qtype))
    assert np.array_equal(lq.quantize(x, qtype, imatrix=qw), ggml.quantize(x, qtype, qw))


@pytest.mark.parametrize("qtype", QUANTIZE, ids=lambda t: t.name)
def test_random_shapes_match_ggml(ggml, qtype):
    rng = np.random.default_rng(int(qtype))
    bs = max(lq.block_size(qtype), 32)
    for _ in range(3):
        rows = int(rng.integers(1, 9))
        cols = bs * int(rng.integers(1, 12))
        x = (rng.standard_normal((rows, cols)) * rng.uniform(1e-3, 1e2)).astype(np.float32)
        qw = (rng.random(cols) + 1e-3).astype(np.float32)
        if not lq.requires_imatrix(qtype):
            assert np.array_equal(lq.quantize(x, qtype), ggml.quantize(x, qtype)), (rows, cols)
        assert np.array_equal(lq.quantize(x, qtype, imatrix=qw), ggml.quantize(x, qtype, qw)), (rows, cols)
