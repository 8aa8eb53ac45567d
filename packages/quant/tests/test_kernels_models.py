"""Kernels on real tensors of the two test models (SmolLM2 Q4_1/Q8_0, Gemma 3 Q4_K/Q5_0/Q6_K/Q8_0),
against gguf-py's dequantization in float64, within the bounds derived in test_kernels.py."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from conftest import gemma3_file, smollm2_file
from gguf import GGMLQuantizationType as T
from gguf import quants
from test_kernels import check

import gguf_io
from llama_quant.kernels import QuantMatrix

MAX_ROWS = 8192  # token_embd / output have 49152 and 262144 rows: a slice keeps the test quick


@pytest.fixture(scope="module")
def models() -> Iterator[dict[str, gguf_io.GGUFFile]]:
    files = {"smollm2": gguf_io.open(smollm2_file()), "gemma3": gguf_io.open(gemma3_file())}
    yield files
    for f in files.values():
        f.close()


CASES = [
    ("smollm2", "blk.0.attn_q.weight"),  # Q4_1 576x576
    ("smollm2", "blk.0.ffn_down.weight"),  # Q4_1 576x1536
    ("smollm2", "blk.0.ffn_up.weight"),  # Q4_1 1536x576
    ("smollm2", "token_embd.weight"),  # Q8_0 49152x576 (sliced)
    ("gemma3", "blk.0.attn_q.weight"),  # Q5_0 1024x640
    ("gemma3", "blk.0.attn_k.weight"),  # Q8_0 256x640
    ("gemma3", "blk.0.ffn_down.weight"),
    ("gemma3", "blk.1.ffn_down.weight"),
    ("gemma3", "blk.0.attn_output.weight"),  # Q4_K 640x1024
    ("gemma3", "token_embd.weight"),  # Q8_0 262144x640 (sliced)
]


@pytest.mark.parametrize(("model", "name"), CASES)
@pytest.mark.parametrize("n", [1, 4, 24])  # 24: the dequantize + BLAS path
def test_real_tensor(models: dict[str, gguf_io.GGUFFile], model: str, name: str, n: int) -> None:
    f = models[model]
    info = f.tensors[name]
    qtype = T(info.ggml_type)
    cols, rows = info.shape[0], info.shape[1]
    raw = f.tensor_bytes(name).reshape(rows, -1)
    rows = min(rows, MAX_ROWS)
    raw = raw[:rows]
    w = quants.dequantize(raw, qtype).astype(np.float64)
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    check(qtype, raw, rows, cols, x, w)


def test_model_types_covered(models: dict[str, gguf_io.GGUFFile]) -> None:
    seen = {T(models[m].tensors[n].ggml_type) for m, n in CASES}
    assert {T.Q4_1, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K} <= seen


def test_from_gguf(models: dict[str, gguf_io.GGUFFile]) -> None:
    f = models["gemma3"]
    m = QuantMatrix.from_gguf(f, "blk.0.attn_q.weight")
    assert (m.rows, m.cols, m.qtype) == (1024, 640, T.Q5_0)
    raw = f.tensor_bytes("blk.0.attn_q.weight")
    x = np.random.default_rng(0).standard_normal(640).astype(np.float32)
    np.testing.assert_array_equal(m.matvec(x), QuantMatrix(raw, T.Q5_0, 1024, 640).matvec(x))
