"""Dequantization bit-identical to gguf-py's gguf.quants.dequantize: random blocks and the real models."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from conftest import gemma3_file, smollm2_file

import llama_quant as lq

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# byte offsets of the fp16 scale fields inside one block, per type
_F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
    "IQ4_NL": [0], "IQ4_XS": [0], "TQ1_0": [52], "TQ2_0": [64],
}  # fmt: skip
EXPECTED_DEQUANTIZE = {
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
    "MXFP4",
}  # fmt: skip


def _finite_scales(raw: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """Clear the fp16 exponent's top bit of every scale field so that scales are finite (|d| < 2)."""
    fmt = lq.get_format(qtype)
    blocks = raw.reshape(-1, fmt.type_size)
    for off in _F16_FIELDS.get(qtype.name, []):
        blocks[:, off + 1] &= 0xBF
    if qtype == gguf.GGMLQuantizationType.IQ1_M:  # the scale's top nibbles are spread over 4 u16
        blocks[:, 55] &= 0xBF
    return raw


def test_dequantize_types_cover_gguf():
    assert {t.name for t in lq.DEQUANTIZE_TYPES} >= EXPECTED_DEQUANTIZE


def _same(ours: np.ndarray, theirs: np.ndarray) -> bool:
    return ours.shape == theirs.shape and np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("finite", [True, False], ids=["finite-scales", "raw-bytes"])
@pytest.mark.parametrize("qtype", lq.DEQUANTIZE_TYPES, ids=lambda t: t.name)
def test_random_blocks_match_gguf(qtype, finite):
    fmt = lq.get_format(qtype)
    rng = np.random.default_rng(int(qtype) + 17 * finite)
    rows, cols = 3, 4 * max(fmt.block_size, 256)
    raw = rng.integers(0, 256, rows * cols // fmt.block_size * fmt.type_size, dtype=np.uint8)
    if finite:
        raw = _finite_scales(raw, qtype)
    theirs = gguf.quants.dequantize(raw.reshape(rows, -1), qtype)
    ours = lq.dequantize(raw, qtype, (rows, cols))
    if finite and fmt.block_size > 1:
        assert np.isfinite(ours).all()
    assert _same(ours, theirs.reshape(rows, cols))
    # any shape whose last dimension is the row length
    assert _same(lq.dequantize(raw, qtype, (1, rows, cols)), theirs.reshape(1, rows, cols))


def _real_models():
    return [pytest.param(smollm2_file, id="smollm2"), pytest.param(gemma3_file, id="gemma3")]


_FULL_LIMIT = 64 * 1024 * 1024  # weights; larger tensors are compared on an even sample of their rows


@pytest.mark.parametrize("model", _real_models())
def test_every_tensor_of_real_models_matches_gguf(model):
    import gguf_io

    path = model()
    seen = set()
    with gguf_io.open(path) as f:
        for info in f.tensors.values():
            shape = tuple(info.np_shape)
            data = f.tensor_bytes(info.name)
            if int(np.prod(shape)) > _FULL_LIMIT:
                # gguf-py's numpy dequantizer is the slow side: every tensor is checked, the largest on a row sample
                rows = data.reshape(shape[0], -1)
                step = -(-int(np.prod(shape)) // _FULL_LIMIT)
                pick = np.unique(np.r_[np.arange(0, rows.shape[0], step), rows.shape[0] - 1])
                data = np.ascontiguousarray(rows[pick])
                shape = (len(pick), *shape[1:])
            theirs = gguf.quants.dequantize(
                data.reshape(shape[0] if len(shape) > 1 else 1, -1), info.ggml_type
            )
            assert _same(lq.dequantize(data, info.ggml_type, shape), theirs.reshape(shape)), info.name
            seen.add(info.ggml_type.name)
    assert seen
