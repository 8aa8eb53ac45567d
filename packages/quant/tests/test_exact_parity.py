"""ExactMatrix against llama.cpp's own CPU kernels, bit for bit: ggml's from_float for the activations and
one ggml vec_dot per output element, through ctypes (``ggml_cpu_oracle``). Meant for a portable build of
llama.cpp (SIMD off: ggml's generic C kernels); run with ``-m parity``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import gemma3_file, smollm2_file
from exact_cases import ACT_KINDS, TYPES, make_acts, weights
from gguf import GGMLQuantizationType as T

import gguf_io
from llama_quant.kernels import Activations, ExactMatrix

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def cpu():
    import ggml_cpu_oracle

    reason = ggml_cpu_oracle.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"parity tests need llama-cpp-python (run `nox -s parity`): {reason}")
    lib = ggml_cpu_oracle.load()
    assert lib is not None
    simd = lib.simd_features()
    if simd:  # the SIMD kernels sum in other orders: only the generic C kernels are the contract
        pytest.skip(
            f"llama_cpp's ggml-cpu is a SIMD build ({', '.join(simd)}); these tests need a portable one"
        )
    return lib


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("kind", ACT_KINDS)
def test_activation_quantization_bytes(cpu, kind: str) -> None:
    n, cols = 3, 768
    x = make_acts(kind, n, cols, seed=4)
    acts = Activations(cols, n).set(x)
    xq, xd, xs, _ = acts.converted("q8")
    q8_0 = cpu.from_float(T.Q8_0, x).reshape(n, -1, 34)
    assert np.array_equal(q8_0[..., 2:].view(np.int8).reshape(n, cols), xq[:n])
    assert _same(q8_0[..., :2].copy().view(np.float16)[..., 0].astype(np.float32), xd[:n])
    q8_1 = cpu.from_float(T.Q8_1, x).reshape(n, -1, 36)
    assert np.array_equal(q8_1[..., 4:].view(np.int8).reshape(n, cols), xq[:n])
    assert _same(q8_1[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32), xs[:n])
    kq, kd, ksum = acts.converted("q8k")
    q8_k = cpu.from_float(T.Q8_K, x).reshape(n, -1, 4 + 256 + 32)
    assert _same(q8_k[..., :4].copy().view(np.float32)[..., 0], kd[:n])
    assert np.array_equal(q8_k[..., 4:260].view(np.int8).reshape(n, cols), kq[:n])
    nonzero = kd[:n].repeat(16, axis=1) != 0  # ggml leaves bsums unwritten for an all-zero block
    bs = q8_k[..., 260:].copy().view(np.int16).reshape(n, -1)
    assert np.array_equal(bs[nonzero], ksum[:n][nonzero])
    for vt, fmt in ((T.F16, "f16"), (T.BF16, "bf16")):
        b = cpu.from_float(vt, x).view(np.uint16)
        want = (
            b.view(np.float16).astype(np.float32)
            if vt == T.F16
            else (b.astype(np.uint32) << 16).view(np.float32)
        )
        assert _same(acts.converted(fmt)[0][:n], want)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("kind", ACT_KINDS)
def test_random_weights(cpu, qtype: T, kind: str) -> None:
    rows, cols = 70, 512
    raw = weights(qtype, rows, cols, seed=ACT_KINDS.index(kind))
    x = make_acts(kind, 7, cols, seed=int(qtype))  # 7: F16 in passes of four, two and one tokens
    want = cpu.matmul(raw, qtype, rows, cols, x)
    m = ExactMatrix(raw, qtype, rows, cols)
    assert _same(m.matmul(x), want)
    for t in range(7):
        assert _same(m.matvec(x[t]), want[t])


def _smollm2() -> Path:
    return smollm2_file()


def _gemma3() -> Path:
    return gemma3_file()


MAX_ROWS = 512  # token_embd has 49152 / 262144 rows: a slice keeps the oracle's per-element calls few
REAL = [
    ("smollm2", "blk.0.attn_q.weight"),  # Q4_1
    ("smollm2", "blk.3.ffn_down.weight"),  # Q4_1, 1536 columns
    ("smollm2", "blk.7.ffn_gate.weight"),  # Q4_1
    ("smollm2", "token_embd.weight"),  # Q8_0 (also the tied output)
    ("gemma3", "blk.0.attn_q.weight"),  # Q5_0
    ("gemma3", "blk.2.ffn_up.weight"),  # Q5_0
    ("gemma3", "blk.0.attn_v.weight"),  # Q8_0
    ("gemma3", "blk.0.attn_output.weight"),  # Q4_K
    ("gemma3", "blk.5.attn_output.weight"),  # Q4_K
    ("gemma3", "blk.0.ffn_down.weight"),  # Q6_K
    ("gemma3", "token_embd.weight"),  # Q8_0
]


@pytest.mark.parametrize(("model", "name"), REAL)
def test_real_tensors(cpu, model: str, name: str) -> None:
    path = _smollm2() if model == "smollm2" else _gemma3()
    with gguf_io.open(path) as f:
        info = f.tensors[name]
        cols, rows = info.shape[0], info.shape[1]
        raw = np.array(f.tensor_bytes(name)).reshape(rows, -1)[:MAX_ROWS]
    rows = raw.shape[0]
    x = np.concatenate([make_acts(k, 1, cols, seed=9) for k in ("normal", "outliers", "mixed")])
    want = cpu.matmul(raw, info.ggml_type, rows, cols, x)
    m = ExactMatrix(raw, info.ggml_type, rows, cols)
    assert _same(m.matmul(x), want)
    assert _same(m.matvec(x[1]), want[1])


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_batch_against_oracle(cpu, qtype: T) -> None:
    rows, cols, n = 130, 768, 9
    raw = weights(qtype, rows, cols, seed=7)
    x = make_acts("mixed", n, cols, seed=8)
    m = ExactMatrix(raw, qtype, rows, cols)
    assert _same(m.matmul(m.quantize_input(x)), cpu.matmul(raw, qtype, rows, cols, x))
