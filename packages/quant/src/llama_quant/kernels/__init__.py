"""Products of ggml weight matrices with f32 activations, bit-identical to llama.cpp's CPU backend.

``ExactMatrix(raw, qtype, rows, cols)`` once per weight, then ``matvec`` / ``matmul``; the activations are
quantized exactly as ggml does (Q8_0, Q8_1, Q8_K, F16, BF16 per weight type) and every output element is
ggml's generic ``vec_dot`` with its float operations in its order. The kernels come from a kernel set
(``llama_quant.cpu.KernelSet``) chosen when the matrix is built. ``Activations`` (or
``ExactMatrix.quantize_input``) converts an input once for several matrices. ``ExpertMatrix`` holds a
mixture-of-experts weight's experts and multiplies each expert by its own tokens (ggml's mul_mat_id). ``warmup()`` compiles (or loads
from numba's cache) every kernel. Plain-numpy references live in
``llama_quant.kernels.ref``. ``release_worker_threads()`` ends numba's worker threads (before a fork).
"""

from __future__ import annotations

import numpy as np

from ..cpu import KernelSet
from .experts import ExpertMatrix
from .matrix import SUPPORTED_TYPES, Activations, ExactMatrix
from .threads import release_worker_threads

__all__ = [
    "SUPPORTED_TYPES",
    "Activations",
    "ExactMatrix",
    "ExpertMatrix",
    "release_worker_threads",
    "warmup",
]


def warmup(kernels: KernelSet | None = None) -> None:
    """Compile every kernel of a kernel set (None: ``resolve_kernel_set(None)``): one small matvec and
    matmul per supported type."""
    from gguf import GGML_QUANT_SIZES

    for qtype in sorted(SUPPORTED_TYPES):
        rows, cols = 64, 256
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        m = ExactMatrix(np.zeros(rows * cols // block * block_bytes, np.uint8), qtype, rows, cols, kernels)
        m.matvec(np.ones(cols, np.float32))
        m.matmul(np.ones((3, cols), np.float32))
