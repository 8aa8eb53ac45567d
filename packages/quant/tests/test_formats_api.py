"""The public API of llama_quant's block formats: type resolution, sizes, shapes and errors."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from conftest import make_imatrix, make_matrix

import llama_quant as lq
from llama_quant.registry import BlockFormat, UnsupportedTypeError

T = gguf.GGMLQuantizationType

EXPECTED_QUANTIZE = {
    "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
}  # fmt: skip


def test_quantize_types():
    assert {t.name for t in lq.QUANTIZE_TYPES} >= EXPECTED_QUANTIZE
    assert set(lq.QUANTIZE_TYPES) <= set(lq.DEQUANTIZE_TYPES)


@pytest.mark.parametrize("spec", [T.Q4_K, int(T.Q4_K), "q4_k", "Q4_K", " Q4_k "])
def test_qtype_spellings(spec):
    assert lq.resolve_qtype(spec) is T.Q4_K
    assert lq.block_size(spec) == 256
    assert lq.type_size(spec) == 144


def test_sizes_match_gguf():
    for t in lq.DEQUANTIZE_TYPES:
        bs, ts = gguf.GGML_QUANT_SIZES[t]
        assert (lq.block_size(t), lq.type_size(t)) == (bs, ts)
        assert lq.row_nbytes(t, 4 * max(bs, 256)) == 4 * max(bs, 256) // bs * ts


def test_unknown_and_unsupported_types():
    with pytest.raises(UnsupportedTypeError, match="unknown ggml type name 'q9_z'"):
        lq.resolve_qtype("q9_z")
    with pytest.raises(UnsupportedTypeError, match="unknown ggml type id 9999"):
        lq.resolve_qtype(9999)
    with pytest.raises(TypeError):
        lq.resolve_qtype(1.5)  # type: ignore[arg-type]
    with pytest.raises(
        UnsupportedTypeError, match=r"quantizing to Q8_K is not supported; supported: .*IQ2_XXS"
    ):
        lq.quantize(np.zeros((1, 256), np.float32), "q8_k")
    with pytest.raises(UnsupportedTypeError, match=r"dequantizing Q8_K is not supported; supported: .*IQ1_M"):
        lq.dequantize(np.zeros(292, np.uint8), "q8_k", (256,))
    assert issubclass(UnsupportedTypeError, ValueError)


def test_requires_imatrix():
    assert {t for t in T if lq.requires_imatrix(t)} == {T.IQ2_XXS, T.IQ2_XS, T.IQ1_S}


def test_quantize_shape_errors():
    x = make_matrix("normal", 2, 96)
    with pytest.raises(ValueError, match="multiple of 256"):
        lq.quantize(x, "q4_k")
    with pytest.raises(ValueError, match="2-D"):
        lq.quantize(np.zeros((2, 2, 32), np.float32), "q8_0")
    with pytest.raises(ValueError, match="one per column"):
        lq.quantize(x, "q8_0", imatrix=np.ones(95, np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        lq.row_nbytes("q4_0", 33)


def test_quantize_returns_flat_bytes_and_accepts_any_float_input():
    x = make_matrix("normal", 3, 256)
    raw = lq.quantize(x.astype(np.float64), "q6_k")
    assert raw.dtype == np.uint8 and raw.shape == (3 * 210,)
    assert np.array_equal(raw, lq.quantize(x, T.Q6_K))
    assert np.array_equal(lq.quantize(x[0], "q6_k"), raw[:210])  # a 1-D vector is one row
    assert lq.quantize(np.zeros((0, 256), np.float32), "q4_k").size == 0


def test_dequantize_inputs_and_errors():
    x = make_matrix("normal", 2, 64)
    raw = lq.quantize(x, "q8_0")
    ref = lq.dequantize(raw, "q8_0", (2, 64))
    assert ref.dtype == np.float32 and ref.shape == (2, 64)
    assert np.array_equal(lq.dequantize(raw.tobytes(), "q8_0", [2, 64]), ref)
    assert np.array_equal(lq.dequantize(memoryview(raw.tobytes()), 8, (128,)), ref.ravel())
    assert np.array_equal(lq.dequantize(raw.reshape(2, -1), "Q8_0", (2, 1, 64)), ref.reshape(2, 1, 64))
    with pytest.raises(ValueError, match="needs 136 bytes, got 135"):
        lq.dequantize(raw[:-1], "q8_0", (2, 64))
    with pytest.raises(ValueError, match="multiple of 32"):
        lq.dequantize(raw, "q8_0", (4, 34))


def test_imatrix_changes_weighted_types_only():
    x = make_matrix("normal", 4, 256)
    qw = make_imatrix(256)
    for name in ("q4_k", "q6_k", "iq4_xs", "q4_0"):
        assert not np.array_equal(lq.quantize(x, name), lq.quantize(x, name, imatrix=qw)), name
    for name in ("q8_0", "tq1_0", "tq2_0", "f16", "bf16"):
        assert np.array_equal(lq.quantize(x, name), lq.quantize(x, name, imatrix=qw)), name


def test_registration_is_by_declaration():
    with pytest.raises(TypeError, match="registered twice"):

        class Again(BlockFormat, qtype=T.Q4_0):
            pass

    fmt = lq.get_format("q4_0")
    assert fmt.qtype is T.Q4_0 and fmt.block_size == 32 and fmt.type_size == 18


def test_f16_conversion_matches_numpy_for_all_magnitudes():
    # ggml's fp32 -> fp16 (round to nearest even) equals numpy's cast on every non-NaN float32 sampled here
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    edge = np.array([0x477FEFFF, 0x477FF000, 0x33000000, 0x33000001, 0x387FC000, 0x38800000], np.uint32)
    x = np.concatenate([bits, edge, edge | np.uint32(0x80000000)]).view(np.float32)
    x = x[~np.isnan(x)]
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    got = lq.quantize(x.reshape(1, -1), "f16").view(np.uint16)
    assert np.array_equal(got, expected)
    nan = np.array([np.nan, -np.nan], np.float32).reshape(1, -1)
    assert lq.quantize(nan, "f16").view(np.uint16).tolist() == [0x7E00, 0xFE00]
