"""The kernels on real tensors of the two test models (SmolLM2 Q4_1/Q8_0, Gemma 3 Q4_K/Q5_0/Q6_K/Q8_0),
bit for bit against the numpy reference, for every kernel set this host runs."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from conftest import gemma3_file, smollm2_file
from gguf import GGMLQuantizationType as T

import gguf_io
from llama_quant.kernels import ExactMatrix, ref

MAX_ROWS = 320  # a slice of five tiles keeps the numpy reference quick


@pytest.fixture(scope="module")
def models() -> Iterator[dict[str, gguf_io.GGUFFile]]:
    files = {"smollm2": gguf_io.open(smollm2_file()), "gemma3": gguf_io.open(gemma3_file())}
    yield files
    for f in files.values():
        f.close()


CASES = [
    ("smollm2", "blk.0.attn_q.weight"),  # Q4_1 576x576
    ("smollm2", "blk.0.ffn_down.weight"),  # Q4_1 576x1536
    ("smollm2", "token_embd.weight"),  # Q8_0 49152x576 (sliced)
    ("gemma3", "blk.0.attn_q.weight"),  # Q5_0 1024x640
    ("gemma3", "blk.0.ffn_down.weight"),
    ("gemma3", "blk.1.ffn_down.weight"),
    ("gemma3", "blk.0.attn_output.weight"),  # Q4_K 640x1024
]


@pytest.mark.parametrize(("model", "name"), CASES)
@pytest.mark.parametrize("n", [1, 5, 17])
def test_real_tensor(models: dict[str, gguf_io.GGUFFile], model: str, name: str, n: int) -> None:
    f = models[model]
    info = f.tensors[name]
    qtype = T(info.ggml_type)
    cols, rows = info.shape[0], min(info.shape[1], MAX_ROWS)
    raw = f.tensor_bytes(name).reshape(info.shape[1], -1)[:rows].reshape(-1)
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    want = np.empty((n, rows), np.float32)
    ref.matmul(want, raw, qtype, rows, cols, x)
    m = ExactMatrix(raw, qtype, rows, cols)
    assert np.array_equal(m.matmul(x), want)
    assert np.array_equal(m.matvec(x[-1]), want[-1])


def test_model_types_covered(models: dict[str, gguf_io.GGUFFile]) -> None:
    seen = {T(models[m].tensors[n].ggml_type) for m, n in CASES}
    assert {T.Q4_1, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K} <= seen


def test_from_gguf(models: dict[str, gguf_io.GGUFFile]) -> None:
    f = models["gemma3"]
    m = ExactMatrix.from_gguf(f, "blk.0.attn_q.weight")
    assert (m.rows, m.cols, m.qtype) == (1024, 640, T.Q5_0)
    raw = f.tensor_bytes("blk.0.attn_q.weight")
    x = np.random.default_rng(0).standard_normal(640).astype(np.float32)
    np.testing.assert_array_equal(m.matvec(x), ExactMatrix(raw, T.Q5_0, 1024, 640).matvec(x))
