"""Every numba kernel of the block formats against its plain-numpy reference (same bytes / same floats)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MATRIX_KINDS, make_imatrix, make_matrix

import llama_quant as lq
from llama_quant.registry import registered_formats

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

FORMATS = registered_formats()
QUANTIZE = [t for t, f in FORMATS.items() if f.quantize_kernel is not None]
DEQUANTIZE = [t for t, f in FORMATS.items() if f.dequantize_kernel is not None]
_NONE = np.zeros(0, np.float32)


def test_every_kernel_has_a_reference():
    for t, f in FORMATS.items():
        assert (f.quantize_kernel is None) == (f.quantize_ref is None), t.name
        assert (f.dequantize_kernel is None) == (f.dequantize_ref is None), t.name


@pytest.mark.parametrize("kind", ["normal", "outliers", "zero_rows", "tiny"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("qtype", QUANTIZE, ids=lambda t: t.name)
def test_quantize_kernel_matches_reference(qtype, weighted, kind):
    fmt = FORMATS[qtype]
    rows, cols = 5, 512
    x = make_matrix(kind, rows, cols, seed=3)
    qw = make_imatrix(cols, seed=3) if weighted else _NONE
    nbytes = rows * lq.row_nbytes(qtype, cols)
    a = np.full(nbytes, 0xAA, np.uint8)
    b = np.full(nbytes, 0x55, np.uint8)
    fmt.quantize_kernel(x.reshape(-1), qw, rows, cols, a)
    fmt.quantize_ref(x.reshape(-1), qw, rows, cols, b)
    assert np.array_equal(a, b), f"first difference at byte {np.flatnonzero(a != b)[:8]}"


def _random_blocks(qtype, nblocks: int, seed: int) -> np.ndarray:
    fmt = FORMATS[qtype]
    return np.random.default_rng(seed).integers(0, 256, nblocks * fmt.type_size, dtype=np.uint8)


@pytest.mark.parametrize("qtype", DEQUANTIZE, ids=lambda t: t.name)
def test_dequantize_kernel_matches_reference(qtype):
    fmt = FORMATS[qtype]
    nblocks = 300 if fmt.block_size > 1 else 4096
    raw = _random_blocks(qtype, nblocks, seed=int(qtype))
    n = nblocks * fmt.block_size
    a = np.empty(n, np.float32)
    b = np.empty(n, np.float32)
    fmt.dequantize_kernel(raw, n, a)
    fmt.dequantize_ref(raw, n, b)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("kind", MATRIX_KINDS)
def test_quantize_reference_roundtrip_shapes(kind):
    # the references accept exactly what the public API passes (flat rows, empty weights)
    # (with weights for the types llama.cpp quantizes only with an importance matrix)
    x = make_matrix(kind, 2, 256)
    qw = make_imatrix(256, seed=5)
    for t in QUANTIZE:
        out = np.empty(2 * lq.row_nbytes(t, 256), np.uint8)
        if FORMATS[t].requires_imatrix:
            FORMATS[t].quantize_ref(x.reshape(-1), qw, 2, 256, out)
            assert np.array_equal(out, lq.quantize(x, t, imatrix=qw)), t.name
        else:
            FORMATS[t].quantize_ref(x.reshape(-1), _NONE, 2, 256, out)
            assert np.array_equal(out, lq.quantize(x, t)), t.name
