"""Products of ggml-quantized weight matrices with f32 activations (the engine's linear layers).

Use ``QuantMatrix(raw, qtype, rows, cols)`` once per weight and its ``matvec`` / ``matmul``; ``matvec`` and
``matmul`` below are one-shot conveniences with llama2.c-style signatures that repack on every call.
``warmup()`` compiles (or loads from numba's cache) every kernel. Plain-numpy references with the same
signatures live in ``llama_quant.kernels.ref``.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from .matrix import SUPPORTED_TYPES, Activations, QuantMatrix
from .threads import release_worker_threads

__all__ = [
    "SUPPORTED_TYPES",
    "Activations",
    "QuantMatrix",
    "matmul",
    "matvec",
    "release_worker_threads",
    "warmup",
]


def matvec(
    out: np.ndarray, w_raw: np.ndarray, qtype: GGMLQuantizationType | int, rows: int, cols: int, x: np.ndarray
) -> None:
    """out[rows] = W[rows, cols] @ x[cols], W given as raw ggml bytes of type ``qtype``."""
    QuantMatrix(w_raw, qtype, rows, cols).matvec(x, out)


def matmul(
    out: np.ndarray, w_raw: np.ndarray, qtype: GGMLQuantizationType | int, rows: int, cols: int, x: np.ndarray
) -> None:
    """out[n, rows] = X[n, cols] @ W.T, W given as raw ggml bytes of type ``qtype``."""
    QuantMatrix(w_raw, qtype, rows, cols).matmul(x, out)


def warmup() -> None:
    """Compile every kernel (numba caches to disk, so later processes only load them): one small product
    per type on the matvec path and one on the BLAS path."""
    from .matrix import _SPECS, BLAS_MIN_TOKENS

    for qtype, spec in _SPECS.items():
        rows, cols = 64, 256
        m = QuantMatrix(np.zeros(rows * cols // spec.block * spec.block_bytes, np.uint8), qtype, rows, cols)
        m.matvec(np.ones(cols, np.float32))
        m.matmul(np.ones((2, cols), np.float32))
        m.matmul(np.ones((BLAS_MIN_TOKENS + 1, cols), np.float32))
