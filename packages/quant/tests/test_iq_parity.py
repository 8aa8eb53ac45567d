"""The i-quant and ternary products against llama.cpp's own CPU kernels, bit for bit (``ggml_cpu_oracle``:
ggml's from_float for the activations, one generic vec_dot per output element); run with ``-m parity``."""

from __future__ import annotations

import numpy as np
import pytest
from exact_cases import ACT_KINDS, make_acts
from gguf import GGMLQuantizationType as T
from iq_cases import IQ_TYPES, iq_weights

from llama_quant.kernels import ExactMatrix

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def cpu():
    import ggml_cpu_oracle

    reason = ggml_cpu_oracle.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"parity tests need llama-cpp-python (run `nox -s parity`): {reason}")
    lib = ggml_cpu_oracle.load()
    assert lib is not None
    if (
        lib.simd_features()
    ):  # the SIMD kernels sum in other orders: only the generic C kernels are the contract
        pytest.skip("llama_cpp's ggml-cpu is a SIMD build; these tests need a portable one")
    return lib


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_products_equal_ggml(cpu, qtype: T) -> None:
    rows, cols = 70, 512
    for i, kind in enumerate(ACT_KINDS):
        raw = iq_weights(qtype, rows, cols, seed=i)
        x = make_acts(kind, 3, cols, seed=int(qtype))
        with np.errstate(all="ignore"):
            want = cpu.matmul(raw, qtype, rows, cols, x)
        m = ExactMatrix(raw, qtype, rows, cols)
        got = m.matmul(x)
        assert np.array_equal(got, want, equal_nan=True), kind
        assert np.array_equal(m.matvec(x[2]), want[2], equal_nan=True), kind
